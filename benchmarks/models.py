"""Benchmark models, built reproducibly with onnx.helper (fixed seeds, no downloads)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
from onnx import TensorProto, numpy_helper

OPSET = 17


def _weight(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    values = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
    return numpy_helper.from_array(values.astype(np.float32), name)


def _float_model(
    nodes: list[onnx.NodeProto],
    name: str,
    x: tuple[str, list[int | str]],
    y: tuple[str, list[int | str]],
    initializers: list[onnx.TensorProto],
) -> onnx.ModelProto:
    """A model with one float32 input ``x`` and one float32 output ``y`` (name, shape)."""
    graph = oh.make_graph(
        nodes,
        name,
        [oh.make_tensor_value_info(x[0], TensorProto.FLOAT, x[1])],
        [oh.make_tensor_value_info(y[0], TensorProto.FLOAT, y[1])],
        initializers,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", OPSET)])


def tiny(width: int = 16) -> onnx.ModelProto:
    """One Gemm and a Relu: the per-request overhead dominates."""
    rng = np.random.default_rng(0)
    nodes = [
        oh.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1),
        oh.make_node("Relu", ["h"], ["y"]),
    ]
    inits = [_weight(rng, "w", (width, width)), _weight(rng, "b", (width,))]
    return _float_model(nodes, "tiny", ("x", ["batch", width]), ("y", ["batch", width]), inits)


def mlp(width: int = 1024, layers: int = 4) -> onnx.ModelProto:
    """``layers`` Gemm+Relu layers of ``width`` units, dynamic batch."""
    rng = np.random.default_rng(1)
    nodes, inits, last = [], [], "x"
    for i in range(layers):
        inits += [_weight(rng, f"w{i}", (width, width)), _weight(rng, f"b{i}", (width,))]
        nodes.append(oh.make_node("Gemm", [last, f"w{i}", f"b{i}"], [f"g{i}"], transB=1))
        last = f"r{i}" if i < layers - 1 else "y"
        nodes.append(oh.make_node("Relu", [f"g{i}"], [last]))
    return _float_model(nodes, "mlp", ("x", ["batch", width]), ("y", ["batch", width]), inits)


def cnn(size: int = 64, channels: tuple[int, ...] = (32, 64, 128)) -> onnx.ModelProto:
    """A small ResNet-style CNN: conv stem, then stride-2 conv + residual 3x3 per stage."""
    rng = np.random.default_rng(2)
    nodes, inits = [], []
    last, width = "x", 3
    for stage, out in enumerate(channels):
        conv = f"s{stage}"
        inits.append(_weight(rng, f"{conv}w", (out, width, 3, 3)))
        inits.append(numpy_helper.from_array(np.zeros(out, np.float32), f"{conv}b"))
        nodes.append(
            oh.make_node(
                "Conv",
                [last, f"{conv}w", f"{conv}b"],
                [f"{conv}c"],
                pads=[1, 1, 1, 1],
                strides=[2, 2],
            )
        )
        nodes.append(oh.make_node("Relu", [f"{conv}c"], [f"{conv}r"]))
        inits.append(_weight(rng, f"{conv}w2", (out, out, 3, 3)))
        nodes.append(
            oh.make_node("Conv", [f"{conv}r", f"{conv}w2"], [f"{conv}c2"], pads=[1, 1, 1, 1])
        )
        nodes.append(oh.make_node("Add", [f"{conv}c2", f"{conv}r"], [f"{conv}a"]))
        nodes.append(oh.make_node("Relu", [f"{conv}a"], [f"{conv}o"]))
        last, width = f"{conv}o", out
    nodes.append(oh.make_node("GlobalAveragePool", [last], ["pool"]))
    nodes.append(oh.make_node("Flatten", ["pool"], ["flat"]))
    inits += [_weight(rng, "fcw", (10, width)), _weight(rng, "fcb", (10,))]
    nodes.append(oh.make_node("Gemm", ["flat", "fcw", "fcb"], ["y"], transB=1))
    return _float_model(nodes, "cnn", ("x", ["batch", 3, size, size]), ("y", ["batch", 10]), inits)


def _const(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def _conv_bn(
    rng: np.random.Generator,
    nodes: list[onnx.NodeProto],
    inits: list[onnx.TensorProto],
    name: str,
    x: str,
    cin: int,
    cout: int,
    k: int,
    stride: int,
    relu: bool,
) -> str:
    """Conv (no bias) + BatchNormalization (+ Relu), as PyTorch exports a ResNet block."""
    inits.append(_weight(rng, f"{name}.w", (cout, cin, k, k)))
    inits.append(_const(f"{name}.g", rng.uniform(0.5, 1.5, cout).astype(np.float32)))
    inits.append(_const(f"{name}.b", rng.normal(0, 0.1, cout).astype(np.float32)))
    inits.append(_const(f"{name}.m", rng.normal(0, 0.1, cout).astype(np.float32)))
    inits.append(_const(f"{name}.v", rng.uniform(0.5, 1.5, cout).astype(np.float32)))
    pad = k // 2
    nodes.append(
        oh.make_node(
            "Conv",
            [x, f"{name}.w"],
            [f"{name}.c"],
            kernel_shape=[k, k],
            pads=[pad] * 4,
            strides=[stride, stride],
            name=f"{name}.conv",
        )
    )
    bn_out = f"{name}.bn" if relu else f"{name}.out"
    nodes.append(
        oh.make_node(
            "BatchNormalization",
            [f"{name}.c", f"{name}.g", f"{name}.b", f"{name}.m", f"{name}.v"],
            [bn_out],
            name=f"{name}.batchnorm",
        )
    )
    if not relu:
        return bn_out
    nodes.append(oh.make_node("Relu", [bn_out], [f"{name}.out"], name=f"{name}.relu"))
    return f"{name}.out"


def resnet18(size: int = 224, classes: int = 1000) -> onnx.ModelProto:
    """A ResNet-18-like CNN as exporters emit it: Conv + BatchNormalization + Relu blocks,
    residual Adds, MaxPool stem, GlobalAveragePool, Flatten and Gemm; random weights."""
    rng = np.random.default_rng(3)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    x = _conv_bn(rng, nodes, inits, "stem", "x", 3, 64, 7, 2, relu=True)
    nodes.append(
        oh.make_node("MaxPool", [x], ["pool0"], kernel_shape=[3, 3], pads=[1] * 4, strides=[2, 2])
    )
    x, width = "pool0", 64
    for stage, out in enumerate((64, 128, 256, 512)):
        for block in range(2):
            name = f"layer{stage + 1}.{block}"
            stride = 2 if stage > 0 and block == 0 else 1
            h = _conv_bn(rng, nodes, inits, f"{name}.a", x, width, out, 3, stride, relu=True)
            h = _conv_bn(rng, nodes, inits, f"{name}.b", h, out, out, 3, 1, relu=False)
            shortcut = x
            if stride != 1 or width != out:
                shortcut = _conv_bn(
                    rng, nodes, inits, f"{name}.down", x, width, out, 1, stride, relu=False
                )
            nodes.append(oh.make_node("Add", [h, shortcut], [f"{name}.sum"]))
            nodes.append(oh.make_node("Relu", [f"{name}.sum"], [f"{name}.out"]))
            x, width = f"{name}.out", out
    nodes.append(oh.make_node("GlobalAveragePool", [x], ["gap"]))
    nodes.append(oh.make_node("Flatten", ["gap"], ["flat"]))
    inits += [_weight(rng, "fc.w", (classes, width)), _weight(rng, "fc.b", (classes,))]
    nodes.append(oh.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], transB=1))
    return _float_model(
        nodes, "resnet18", ("x", ["batch", 3, size, size]), ("logits", ["batch", classes]), inits
    )


def _linear(
    rng: np.random.Generator,
    nodes: list[onnx.NodeProto],
    inits: list[onnx.TensorProto],
    name: str,
    x: str,
    cin: int,
    cout: int,
) -> str:
    """MatMul + Add with a [cin, cout] weight, as torch.onnx exports nn.Linear on 3-D data."""
    inits.append(_weight(rng, f"{name}.w", (cin, cout)))
    inits.append(_const(f"{name}.b", rng.normal(0, 0.02, cout).astype(np.float32)))
    nodes.append(oh.make_node("MatMul", [x, f"{name}.w"], [f"{name}.mm"]))
    nodes.append(oh.make_node("Add", [f"{name}.mm", f"{name}.b"], [f"{name}.out"]))
    return f"{name}.out"


def _layer_norm_decomposed(
    nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], name: str, x: str, width: int
) -> str:
    """LayerNorm as exporters before opset 17 emit it: ReduceMean, Sub, Pow, ReduceMean,
    Add(eps), Sqrt, Div, Mul(gamma), Add(beta)."""
    rng = np.random.default_rng(abs(hash(name)) % (1 << 32))
    inits += [
        _const(f"{name}.g", rng.uniform(0.8, 1.2, width).astype(np.float32)),
        _const(f"{name}.b", rng.normal(0, 0.05, width).astype(np.float32)),
    ]
    p = name
    nodes += [
        oh.make_node("ReduceMean", [x], [f"{p}.mean"], axes=[-1]),
        oh.make_node("Sub", [x, f"{p}.mean"], [f"{p}.d"]),
        oh.make_node("Pow", [f"{p}.d", "two"], [f"{p}.sq"]),
        oh.make_node("ReduceMean", [f"{p}.sq"], [f"{p}.var"], axes=[-1]),
        oh.make_node("Add", [f"{p}.var", "eps"], [f"{p}.ve"]),
        oh.make_node("Sqrt", [f"{p}.ve"], [f"{p}.std"]),
        oh.make_node("Div", [f"{p}.d", f"{p}.std"], [f"{p}.n"]),
        oh.make_node("Mul", [f"{p}.n", f"{p}.g"], [f"{p}.s"]),
        oh.make_node("Add", [f"{p}.s", f"{p}.b"], [f"{p}.out"]),
    ]
    return f"{p}.out"


def bert(
    layers: int = 6, hidden: int = 384, heads: int = 12, intermediate: int = 1536
) -> onnx.ModelProto:
    """A BERT-style encoder (MiniLM-L6 sizes) the way torch.onnx (opset 13-16) emits it:
    MatMul + Add projections, reshapes from Shape/Gather/Concat subgraphs, scaled
    MatMul/Softmax attention with an additive mask built from ``attention_mask``,
    decomposed LayerNorm, GELU via Erf. Inputs: ``hidden_states`` [batch, seq, hidden]
    float32 (the embeddings) and ``attention_mask`` [batch, seq] int64."""
    rng = np.random.default_rng(4)
    head = hidden // heads
    nodes: list[onnx.NodeProto] = []
    inits = [
        _const("two", np.array(2.0, np.float32)),
        _const("eps", np.array(1e-12, np.float32)),
        _const("one", np.array(1.0, np.float32)),
        _const("half", np.array(0.5, np.float32)),
        _const("sqrt2", np.array(np.sqrt(2.0), np.float32)),
        _const("neg", np.array(-10000.0, np.float32)),
        _const("scale", np.array(np.sqrt(head), np.float32)),
        _const("i0", np.array([0], np.int64)),
        _const("i1", np.array([1], np.int64)),
        _const("heads", np.array([heads, head], np.int64)),
        _const("hidden", np.array([hidden], np.int64)),
        _const("mask_axes", np.array([1, 2], np.int64)),
    ]
    nodes += [
        oh.make_node("Unsqueeze", ["attention_mask", "mask_axes"], ["mask4"]),
        oh.make_node("Cast", ["mask4"], ["maskf"], to=TensorProto.FLOAT),
        oh.make_node("Sub", ["one", "maskf"], ["maskinv"]),
        oh.make_node("Mul", ["maskinv", "neg"], ["mask_add"]),
        oh.make_node("Shape", ["hidden_states"], ["shape"]),
        oh.make_node("Gather", ["shape", "i0"], ["dim_b"], axis=0),
        oh.make_node("Gather", ["shape", "i1"], ["dim_s"], axis=0),
        oh.make_node("Concat", ["dim_b", "dim_s", "heads"], ["split_shape"], axis=0),
        oh.make_node("Concat", ["dim_b", "dim_s", "hidden"], ["merge_shape"], axis=0),
    ]
    x = "hidden_states"
    for layer in range(layers):
        p = f"l{layer}"
        q = _linear(rng, nodes, inits, f"{p}.q", x, hidden, hidden)
        k = _linear(rng, nodes, inits, f"{p}.k", x, hidden, hidden)
        v = _linear(rng, nodes, inits, f"{p}.v", x, hidden, hidden)
        for name, perm in ((q, [0, 2, 1, 3]), (k, [0, 2, 3, 1]), (v, [0, 2, 1, 3])):
            nodes.append(oh.make_node("Reshape", [name, "split_shape"], [f"{name}.4d"]))
            nodes.append(oh.make_node("Transpose", [f"{name}.4d"], [f"{name}.t"], perm=perm))
        nodes += [
            oh.make_node("MatMul", [f"{q}.t", f"{k}.t"], [f"{p}.scores"]),
            oh.make_node("Div", [f"{p}.scores", "scale"], [f"{p}.scaled"]),
            oh.make_node("Add", [f"{p}.scaled", "mask_add"], [f"{p}.masked"]),
            oh.make_node("Softmax", [f"{p}.masked"], [f"{p}.probs"], axis=-1),
            oh.make_node("MatMul", [f"{p}.probs", f"{v}.t"], [f"{p}.ctx"]),
            oh.make_node("Transpose", [f"{p}.ctx"], [f"{p}.ctx.t"], perm=[0, 2, 1, 3]),
            oh.make_node("Reshape", [f"{p}.ctx.t", "merge_shape"], [f"{p}.ctx.m"]),
        ]
        o = _linear(rng, nodes, inits, f"{p}.o", f"{p}.ctx.m", hidden, hidden)
        nodes.append(oh.make_node("Add", [o, x], [f"{p}.res1"]))
        h = _layer_norm_decomposed(nodes, inits, f"{p}.ln1", f"{p}.res1", hidden)
        f = _linear(rng, nodes, inits, f"{p}.ff1", h, hidden, intermediate)
        nodes += [
            oh.make_node("Div", [f, "sqrt2"], [f"{p}.g.d"]),
            oh.make_node("Erf", [f"{p}.g.d"], [f"{p}.g.e"]),
            oh.make_node("Add", [f"{p}.g.e", "one"], [f"{p}.g.a"]),
            oh.make_node("Mul", [f, f"{p}.g.a"], [f"{p}.g.m"]),
            oh.make_node("Mul", [f"{p}.g.m", "half"], [f"{p}.gelu"]),
        ]
        f2 = _linear(rng, nodes, inits, f"{p}.ff2", f"{p}.gelu", intermediate, hidden)
        nodes.append(oh.make_node("Add", [f2, h], [f"{p}.res2"]))
        x = _layer_norm_decomposed(nodes, inits, f"{p}.ln2", f"{p}.res2", hidden)
    nodes.append(oh.make_node("Identity", [x], ["last_hidden_state"]))
    graph = oh.make_graph(
        nodes,
        "bert",
        [
            oh.make_tensor_value_info("hidden_states", TensorProto.FLOAT, ["batch", "seq", hidden]),
            oh.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [
            oh.make_tensor_value_info(
                "last_hidden_state", TensorProto.FLOAT, ["batch", "seq", hidden]
            )
        ],
        inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)])


def lstm(features: int = 50, hidden: int = 50, layers: int = 2) -> onnx.ModelProto:
    """``layers`` stacked ONNX LSTM nodes (sequence-major [seq, batch, features])."""
    rng = np.random.default_rng(5)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    x, width = "x", features
    for i in range(layers):
        inits += [
            _weight(rng, f"W{i}", (1, 4 * hidden, width)),
            _weight(rng, f"R{i}", (1, 4 * hidden, hidden)),
            _const(f"B{i}", rng.normal(0, 0.1, (1, 8 * hidden)).astype(np.float32)),
        ]
        nodes.append(
            oh.make_node("LSTM", [x, f"W{i}", f"R{i}", f"B{i}"], [f"y{i}"], hidden_size=hidden)
        )
        nodes.append(oh.make_node("Squeeze", [f"y{i}", "axis1"], [f"h{i}"]))
        x, width = f"h{i}", hidden
    inits.append(_const("axis1", np.array([1], np.int64)))
    nodes.append(oh.make_node("Identity", [x], ["y"]))
    return _float_model(
        nodes, "lstm", ("x", ["seq", "batch", features]), ("y", ["seq", "batch", hidden]), inits
    )


def light_model(name: str, seed: int = 6) -> onnx.ModelProto:
    """The onnx package's light ``name`` model (``resnet50``, ``squeezenet``, ...) with
    random weights: its weights are ConstantOfShape nodes (zeros), replaced here by
    initializers drawn with a fixed seed (BatchNormalization scales and variances
    positive, so activations stay finite)."""
    import os

    folder = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    model = onnx.load(os.path.join(folder, f"light_{name}.onnx"))
    graph = model.graph
    rng = np.random.default_rng(seed)
    shapes = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    positive = {n.input[i] for n in graph.node if n.op_type == "BatchNormalization" for i in (1, 4)}

    def draw(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
        if name in positive:
            return _const(name, rng.uniform(0.5, 1.5, shape).astype(np.float32))
        if len(shape) >= 2:
            return _weight(rng, name, shape)
        return _const(name, rng.normal(0, 0.1, shape).astype(np.float32))

    weights = {
        name: draw(name, array.shape) for name, array in shapes.items() if array.dtype.kind == "f"
    }
    kept = []
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in shapes:
            shape = tuple(int(d) for d in shapes[node.input[0]])
            weights[node.output[0]] = draw(node.output[0], shape)
        else:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    used = {i for n in graph.node for i in n.input}
    kept_shapes = [t for t in graph.initializer if t.name in used and t.name not in weights]
    del graph.initializer[:]
    graph.initializer.extend(kept_shapes + [t for n, t in weights.items() if n in used])
    names = {t.name for t in graph.initializer}
    feeds = [i for i in graph.input if i.name not in names and i.name in used]
    del graph.input[:]
    graph.input.extend(feeds)
    # From IR version 4 on, initializers need not be listed as graph inputs.
    model.ir_version = max(model.ir_version, 4)
    return model


def gru_step(features: int = 32, hidden: int = 64) -> onnx.ModelProto:
    """One GRU step with its state as a port: ``x [1, batch, features]`` and
    ``h0 [1, batch, hidden]`` give ``y`` and ``hn`` (``STATEFUL: auto`` pairs h0 -> hn)."""
    rng = np.random.default_rng(8)
    inits = [
        _weight(rng, "W", (1, 3 * hidden, features)),
        _weight(rng, "R", (1, 3 * hidden, hidden)),
        _const("B", rng.normal(0, 0.1, (1, 6 * hidden)).astype(np.float32)),
    ]
    nodes = [
        oh.make_node("GRU", ["x", "W", "R", "B", "", "h0"], ["", "hn"], hidden_size=hidden),
        oh.make_node("Identity", ["hn"], ["y"]),
    ]
    state = [1, "batch", hidden]
    graph = oh.make_graph(
        nodes,
        "gru_step",
        [
            oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, "batch", features]),
            oh.make_tensor_value_info("h0", TensorProto.FLOAT, state),
        ],
        [
            oh.make_tensor_value_info("y", TensorProto.FLOAT, state),
            oh.make_tensor_value_info("hn", TensorProto.FLOAT, state),
        ],
        inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", OPSET)])


def kv_cache_step(width: int = 64) -> onnx.ModelProto:
    """A KV-cache-like step: ``present = Concat(past, x Wk)`` along the sequence, and
    ``y`` attends over ``present`` with the query ``x Wq`` (``x [batch, 1, width]``,
    ``past [batch, past_sequence, width]``; ``STATEFUL: auto`` pairs past -> present)."""
    rng = np.random.default_rng(9)
    inits = [_weight(rng, "Wk", (width, width)), _weight(rng, "Wq", (width, width))]
    nodes = [
        oh.make_node("MatMul", ["x", "Wk"], ["k"]),
        oh.make_node("Concat", ["past", "k"], ["present"], axis=1),
        oh.make_node("MatMul", ["x", "Wq"], ["q"]),
        oh.make_node("Transpose", ["present"], ["kt"], perm=[0, 2, 1]),
        oh.make_node("MatMul", ["q", "kt"], ["scores"]),
        oh.make_node("Softmax", ["scores"], ["weights"], axis=-1),
        oh.make_node("MatMul", ["weights", "present"], ["y"]),
    ]
    graph = oh.make_graph(
        nodes,
        "kv_cache_step",
        [
            oh.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, width]),
            oh.make_tensor_value_info("past", TensorProto.FLOAT, ["batch", "past_sequence", width]),
        ],
        [
            oh.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1, width]),
            oh.make_tensor_value_info(
                "present", TensorProto.FLOAT, ["batch", "total_sequence", width]
            ),
        ],
        inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", OPSET)])
