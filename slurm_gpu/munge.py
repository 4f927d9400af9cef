"""MUNGE credentials through libmunge (ctypes): encode on a node, decode on the head node.

Every Slurm node runs munged with the cluster's shared key; a credential it encodes
carries the uid and gid of the process that asked, the address of the host, the time and
a payload, and only a munged holding the same key decodes it, once (a second decode is
EMUNGE_CRED_REPLAYED). See munge(3), munge_ctx(3), munge_enum(3):
https://github.com/dun/munge/wiki/Man-3-munge

libmunge is called in-process rather than through `munge`/`unmunge`: the collector decodes
one credential per batch, and a fork per request would cost more than the check itself.
The library is loaded on first use, so importing this module needs no MUNGE.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import socket
import threading
from dataclasses import dataclass

from slurm_gpu.errors import SlurmGpuError

# munge_err_t (munge.h), the codes the collector tells apart.
EMUNGE_SOCKET = 6
EMUNGE_TIMEOUT = 7
EMUNGE_CRED_EXPIRED = 15
EMUNGE_CRED_REWOUND = 16
EMUNGE_CRED_REPLAYED = 17
# munge_opt_t (munge.h)
_MUNGE_OPT_TTL = 4
_MUNGE_OPT_ADDR4 = 5
_MUNGE_OPT_ENCODE_TIME = 6
_MUNGE_OPT_SOCKET = 8


class MungeError(SlurmGpuError):
    """libmunge refused: no munged, an invalid, expired or replayed credential.

    Attributes:
        code: the munge_err_t (EMUNGE_CRED_REPLAYED, EMUNGE_CRED_EXPIRED, ...); 0 when
            libmunge itself could not be loaded.
    """

    def __init__(self, code: int, message: str) -> None:
        self.code = code
        super().__init__(message)


@dataclass(frozen=True)
class MungeCredential:
    """A decoded credential, as `unmunge` prints it.

    Attributes:
        uid: UID of the process that encoded it.
        gid: GID of that process.
        payload: the bytes it carries.
        address: ENCODE_HOST's IPv4 address ("10.0.0.7"), as that host's munged saw itself.
        encode_time: ENCODE_TIME, POSIX seconds.
        ttl: TTL, seconds.
    """

    uid: int
    gid: int
    payload: bytes
    address: str
    encode_time: int
    ttl: int


class Libmunge:
    """munge_encode / munge_decode over libmunge.so.2.

    Args:
        socket_path: munged's socket ("" = libmunge's default, /run/munge/munge.socket.2).
        library: the shared library to load.
    """

    def __init__(self, socket_path: str = "", library: str = "libmunge.so.2") -> None:
        self.socket_path = socket_path
        self.library = library
        self._lib: ctypes.CDLL | None = None
        self._libc: ctypes.CDLL | None = None
        self._lock = threading.Lock()

    def _load(self) -> tuple[ctypes.CDLL, ctypes.CDLL]:
        with self._lock:
            if self._lib is None or self._libc is None:
                try:
                    lib = ctypes.CDLL(self.library)
                    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                except OSError as exc:
                    raise MungeError(0, f"cannot load {self.library}: {exc}") from None
                lib.munge_strerror.restype = ctypes.c_char_p
                lib.munge_strerror.argtypes = [ctypes.c_int]
                lib.munge_ctx_create.restype = ctypes.c_void_p
                lib.munge_ctx_destroy.argtypes = [ctypes.c_void_p]
                lib.munge_ctx_set.argtypes = [ctypes.c_void_p, ctypes.c_int]
                lib.munge_ctx_get.argtypes = [ctypes.c_void_p, ctypes.c_int]
                lib.munge_encode.argtypes = [
                    ctypes.POINTER(ctypes.c_char_p),
                    ctypes.c_void_p,
                    ctypes.c_char_p,
                    ctypes.c_int,
                ]
                lib.munge_decode.argtypes = [
                    ctypes.c_char_p,
                    ctypes.c_void_p,
                    ctypes.POINTER(ctypes.c_void_p),
                    ctypes.POINTER(ctypes.c_int),
                    ctypes.POINTER(ctypes.c_uint),
                    ctypes.POINTER(ctypes.c_uint),
                ]
                libc.free.argtypes = [ctypes.c_void_p]
                self._lib, self._libc = lib, libc
            return self._lib, self._libc

    def _context(self, lib: ctypes.CDLL) -> int:
        ctx = lib.munge_ctx_create()
        if not ctx:
            raise MungeError(5, "munge_ctx_create: out of memory")
        if self.socket_path:
            err = lib.munge_ctx_set(ctx, _MUNGE_OPT_SOCKET, self.socket_path.encode())
            if err:
                lib.munge_ctx_destroy(ctx)
                raise MungeError(err, f"munge socket {self.socket_path}: {_text(lib, err)}")
        return int(ctx)

    def encode(self, payload: bytes) -> str:
        """A credential of this process's uid and gid over `payload` (`munge -s`).

        Raises:
            MungeError: munged is not answering, or libmunge is missing.
        """
        lib, libc = self._load()
        ctx = self._context(lib)
        cred = ctypes.c_char_p()
        try:
            err = lib.munge_encode(ctypes.byref(cred), ctx, payload, len(payload))
            if err:
                raise MungeError(err, f"munge_encode: {_text(lib, err)}")
            return (cred.value or b"").decode("ascii")
        finally:
            if cred.value is not None:
                libc.free(ctypes.cast(cred, ctypes.c_void_p))
            lib.munge_ctx_destroy(ctx)

    def decode(self, credential: str) -> MungeCredential:
        """The credential's uid, gid, payload, origin address and times (`unmunge`).

        Raises:
            MungeError: its code says why (EMUNGE_CRED_REPLAYED, EMUNGE_CRED_EXPIRED,
                EMUNGE_SOCKET when munged is not answering, ...).
        """
        lib, libc = self._load()
        ctx = self._context(lib)
        buf = ctypes.c_void_p()
        length = ctypes.c_int()
        uid = ctypes.c_uint()
        gid = ctypes.c_uint()
        try:
            err = lib.munge_decode(
                credential.encode("ascii", "replace"),
                ctx,
                ctypes.byref(buf),
                ctypes.byref(length),
                ctypes.byref(uid),
                ctypes.byref(gid),
            )
            if err:
                raise MungeError(err, f"munge_decode: {_text(lib, err)}")
            payload = ctypes.string_at(buf, length.value) if buf.value else b""
            addr = (ctypes.c_ubyte * 4)()
            ttl = ctypes.c_int()
            encoded = ctypes.c_long()  # time_t
            lib.munge_ctx_get(ctx, _MUNGE_OPT_ADDR4, ctypes.byref(addr))
            lib.munge_ctx_get(ctx, _MUNGE_OPT_TTL, ctypes.byref(ttl))
            lib.munge_ctx_get(ctx, _MUNGE_OPT_ENCODE_TIME, ctypes.byref(encoded))
            return MungeCredential(
                uid=uid.value,
                gid=gid.value,
                payload=payload,
                address=socket.inet_ntoa(bytes(addr)),
                encode_time=encoded.value,
                ttl=ttl.value,
            )
        finally:
            if buf.value:
                libc.free(buf)
            lib.munge_ctx_destroy(ctx)


def _text(lib: ctypes.CDLL, err: int) -> str:
    text: bytes | None = lib.munge_strerror(err)
    return f"{(text or b'error').decode(errors='replace')} ({err})"
