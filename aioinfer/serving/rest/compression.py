"""HTTP content codings of infer bodies: gzip and deflate, both ways.

tritonclient compresses a request body when asked (``request_compression_algorithm``,
with ``Content-Encoding``) and asks for a compressed response
(``response_compression_algorithm``, with ``Accept-Encoding``). A compressed body is
inflated at most to the server's request size limit: a few kilobytes that inflate to
gigabytes (a decompression bomb) stop at the limit with 413, never exhausting memory.
"Deflate" is the zlib format (RFC 9110), the one tritonclient sends; a raw deflate
stream, which some clients send instead, is accepted too.
"""

from __future__ import annotations

import zlib

from aioinfer.errors import ErrorKind, ProtocolError

CODINGS = ("gzip", "deflate")
"""The content codings the server reads and writes (besides ``identity``)."""

_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def decompress(body: bytes, coding: str, limit: int) -> bytes:
    """``body`` decoded from ``coding`` (a ``Content-Encoding`` value), at most ``limit``
    bytes of it.

    Raises:
        ProtocolError: UNSUPPORTED_MEDIA for a coding other than gzip, deflate and
            identity; TOO_LARGE when the decoded body exceeds ``limit`` bytes;
            INVALID_ARGUMENT for data that is corrupt, truncated or followed by other
            bytes.
    """
    coding = coding.strip().lower()
    if coding in ("", "identity"):
        return body
    wbits = _WBITS.get(coding)
    if wbits is None:
        raise ProtocolError(
            f"Content-Encoding {coding!r} is not supported; send gzip, deflate or identity",
            ErrorKind.UNSUPPORTED_MEDIA,
        )
    if coding == "deflate" and not _zlib_header(body):
        wbits = -zlib.MAX_WBITS  # a raw deflate stream
    parts: list[bytes] = []
    size, rest = 0, body
    while True:  # a gzip body may hold several members, one after the other
        inflater = zlib.decompressobj(wbits)
        try:
            part = inflater.decompress(rest, limit - size + 1)
        except zlib.error as exc:
            raise ProtocolError(f"the request body is not valid {coding} data: {exc}") from None
        size += len(part)
        if size > limit:
            raise ProtocolError(
                f"the request body decompresses to more than the limit of {limit} bytes",
                ErrorKind.TOO_LARGE,
            )
        if not inflater.eof:
            raise ProtocolError(f"the {coding} request body is truncated")
        parts.append(part)
        rest = inflater.unused_data
        if not rest:
            return b"".join(parts)
        if wbits != _WBITS["gzip"]:
            raise ProtocolError(f"{len(rest)} bytes follow the {coding} data of the request body")


def _zlib_header(body: bytes) -> bool:
    """Whether ``body`` starts with a zlib header (deflate method, valid check bits)."""
    return len(body) >= 2 and body[0] & 0x0F == 8 and (body[0] << 8 | body[1]) % 31 == 0


def compress(body: bytes, coding: str) -> bytes:
    """``body`` encoded in ``coding`` (one of :data:`CODINGS`)."""
    compressor = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, _WBITS[coding])
    return compressor.compress(body) + compressor.flush()


SMALL_BINARY_BYTES = 64 * 2**10
"""A response with binary tensor data shorter than this is sent uncompressed whatever
the client accepts (``Accept-Encoding`` states a preference; HTTP clients such as
aiohttp send ``gzip, deflate`` on every request): raw tensor bytes shrink little, and
compressing them cost the event loop a fifth of its time serving single MLP rows to
tritonclient's asyncio client (``benchmarks/serving.py``, profiled)."""


def worth_compressing(size: int, binary: bool) -> bool:
    """Whether a response body of ``size`` bytes, with binary tensor data or all JSON
    (which shrinks severalfold), is compressed for a client that accepts it."""
    return not binary or size >= SMALL_BINARY_BYTES


def response_coding(accept_encoding: str) -> str | None:
    """The coding of :data:`CODINGS` that an ``Accept-Encoding`` value prefers (the
    highest q-value; the first listed on a tie), or None for an uncompressed response."""
    best, best_q = None, 0.0
    for entry in accept_encoding.split(","):
        coding, _, parameters = entry.partition(";")
        coding = coding.strip().lower()
        if coding not in CODINGS:
            continue
        q = 1.0
        for parameter in parameters.split(";"):
            key, _, value = parameter.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if q > best_q:
            best, best_q = coding, q
    return best
