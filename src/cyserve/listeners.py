"""Where a server listens: TCP addresses, Unix sockets, inherited descriptors, systemd's sockets.

The options (Config.bind, uds, uds_perms, fd) name addresses as gunicorn and uvicorn spell them:

    HOST:PORT  [V6]:PORT  HOST (port 8000)   a TCP address: the engine binds one SO_REUSEPORT
                                             listener per worker thread (and per process)
    unix:PATH  (or --uds PATH)               a Unix socket made here, its mode set to --uds-perms
    fd://N     (or --fd N)                   a listening socket inherited from the parent

With none of them, the server listens on host:port, unless it was started by systemd's socket
activation (LISTEN_PID is this process and LISTEN_FDS=n): then it serves the n sockets systemd
passed, descriptors 3 to 3+n-1 (sd_listen_fds(3)), and host and port are not used.

A Unix socket or an inherited descriptor cannot be cloned per worker (a path names one socket;
somebody else made the inherited one), so the engine shares one descriptor among its workers
(csrc/listen.c says how). This module makes those sockets, once per server: in the serving
process, or in the process supervisor before it forks, so that every worker process and every
replacement accepts from the same socket and nothing queued on it is lost when one goes.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, ListenError

__all__ = ["Address", "Listeners", "parse_bind", "systemd_fds", "SD_LISTEN_FDS_START"]

# sd_listen_fds(3): systemd passes its sockets from this descriptor on.
SD_LISTEN_FDS_START = 3

DEFAULT_PORT = 8000


@dataclass(frozen=True)
class Address:
    """One listening address: kind "tcp" (host, port), "unix" (path) or "fd" (fd)."""

    kind: str
    host: str = ""
    port: int = 0
    path: str = ""
    fd: int = -1

    def url(self, port: int | None = None) -> str:
        """How a status line names it: http://HOST:PORT (the bound port when given), unix:PATH,
        fd://N."""
        if self.kind == "unix":
            return f"unix:{self.path}"
        if self.kind == "fd":
            return f"fd://{self.fd}"
        p = self.port if port is None else port
        return f"http://[{self.host}]:{p}" if ":" in self.host else f"http://{self.host}:{p}"


def parse_bind(spec: str, option: str = "bind") -> Address:
    """An Address from one --bind value; ConfigError(option, spec, why) when it is not one."""
    if not isinstance(spec, str) or not spec or spec != spec.strip():
        raise ConfigError(option, repr(spec), "must be HOST:PORT, [V6]:PORT, unix:PATH or fd://N")
    if spec.startswith("unix:"):
        path = spec[len("unix:"):]
        if not path:
            raise ConfigError(option, spec, "unix: needs a socket path (unix:/run/app.sock)")
        check_uds_path(option, spec, path)
        return Address("unix", path=path)
    if spec.startswith("fd://"):
        return Address("fd", fd=_parse_fd(option, spec, spec[len("fd://"):]))
    if spec.startswith("["):
        host, sep, rest = spec[1:].partition("]")
        if not sep or not host:
            raise ConfigError(option, spec, "an IPv6 address goes in brackets: [::1]:8000")
        if rest and not rest.startswith(":"):
            raise ConfigError(option, spec, "expected [V6]:PORT")
        port_text = rest[1:] if rest else ""
        if rest == ":":
            raise ConfigError(option, spec, "the port is missing after ':'")
    else:
        if spec.count(":") > 1:
            raise ConfigError(option, spec, "an IPv6 address goes in brackets: [::1]:8000")
        host, sep, port_text = spec.partition(":")
        if sep and not port_text:
            raise ConfigError(option, spec, "the port is missing after ':'")
        if not host:
            raise ConfigError(option, spec, "the host is missing (use 0.0.0.0:PORT for every "
                                            "IPv4 address)")
    port = DEFAULT_PORT
    if port_text:
        if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
            raise ConfigError(option, spec, f"port {port_text!r} must be a number in 0..65535")
        port = int(port_text)
    return Address("tcp", host=host, port=port)


def _parse_fd(option: str, spec: str, text: str) -> int:
    if not text.isdigit():
        raise ConfigError(option, spec, "a descriptor must be a non-negative integer (fd://3)")
    return int(text)


def check_uds_path(option: str, value: object, path: str) -> None:
    # sun_path holds 108 bytes with its NUL; a longer path cannot be bound at all.
    if "\0" in path:
        raise ConfigError(option, repr(value), "a socket path cannot contain NUL")
    if len(os.fsencode(path)) > 107:
        raise ConfigError(option, repr(value), "a Unix socket path is at most 107 bytes long")


def systemd_fds(environ: Mapping[str, str] | None = None, pid: int | None = None) -> list[int]:
    """The descriptors systemd passed to this process (sd_listen_fds(3)): [] unless LISTEN_PID
    names this process and LISTEN_FDS is a positive count."""
    env = os.environ if environ is None else environ
    want = env.get("LISTEN_PID", "")
    count = env.get("LISTEN_FDS", "")
    if not want.isdigit() or not count.isdigit():
        return []
    if int(want) != (os.getpid() if pid is None else pid) or int(count) < 1:
        return []
    return list(range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + int(count)))


def configured_addresses(bind: Sequence[str], uds: str | None, fd: int | None,
                         host: str, port: int) -> tuple[list[Address], bool]:
    """The addresses the options name, in order (each --bind, then --uds, then --fd), and
    whether they were given at all (False: host and port, or systemd's sockets, serve)."""
    addresses = [parse_bind(b) for b in bind]
    if uds is not None:
        addresses.append(Address("unix", path=uds))
    if fd is not None:
        addresses.append(Address("fd", fd=fd))
    if addresses:
        return addresses, True
    return [Address("tcp", host=host, port=port)], False


class Listeners:
    """The sockets of a server, made once: open() makes the Unix sockets and checks the
    descriptors; engine_listen() is what cyserve._core.Server takes as ``listen``; close()
    closes what open() made and removes its socket files.

    TCP addresses are not opened here: the engine binds one listener per worker for each. Unless
    ``share_tcp``: for workers that give up root (--user), which could no longer bind a
    privileged port, each TCP address is bound here too, once, and shared as a Unix socket is.
    ``owner`` (uid, gid): the Unix socket files are given to them, as gunicorn does, so that the
    workers' user owns what it serves on."""

    def __init__(self, addresses: Sequence[Address], *, backlog: int = 1024,
                 uds_perms: int | None = None, systemd: bool = False, share_tcp: bool = False,
                 owner: tuple[int, int] | None = None) -> None:
        self.addresses = list(addresses)
        self.backlog = backlog
        self.uds_perms = uds_perms
        self.systemd = systemd  # the descriptors came from LISTEN_FDS
        # Whether the options named the addresses (or systemd did): False for host:port alone.
        self.explicit = systemd or not (len(self.addresses) == 1 and
                                        self.addresses[0].kind == "tcp")
        self._sockets: list[socket.socket] = []
        # The Unix socket files made here, with their (st_dev, st_ino) as bind() left them.
        self._made_paths: list[tuple[str, tuple[int, int]]] = []
        self._owner = os.getpid()
        self.share_tcp = share_tcp
        self.owner = owner

    @classmethod
    def for_config(cls, config: Any) -> Listeners:
        """The listeners of a cyserve.config.Config (not imported: it imports this module)."""
        addresses, explicit = configured_addresses(config.bind, config.uds, config.fd,
                                                   config.host, config.port)
        systemd = False
        if not explicit:
            fds = systemd_fds()
            if fds:
                addresses = [Address("fd", fd=n) for n in fds]
                systemd = True
        owner = config.process_owner()
        listeners = cls(addresses, backlog=config.backlog, uds_perms=config.uds_perms,
                        systemd=systemd, share_tcp=owner is not None,
                        owner=owner[:2] if owner is not None else None)
        listeners.explicit = explicit or systemd
        return listeners

    @property
    def default(self) -> bool:
        """Whether the server listens on host and port alone, the way it always did."""
        return not self.explicit and not self.share_tcp

    @property
    def tcp(self) -> list[Address]:
        return [a for a in self.addresses if a.kind == "tcp"]

    def open(self) -> None:
        """Make the Unix sockets and check the inherited descriptors. ListenError naming the
        address when one cannot be used; nothing is left open then."""
        try:
            for i, a in enumerate(self.addresses):
                if a.kind == "unix":
                    self._sockets.append(self._open_unix(a.path))
                elif a.kind == "tcp" and self.share_tcp:
                    sock = self._open_tcp(a)
                    self._sockets.append(sock)
                    # The port bound, for the status lines when port 0 was asked for.
                    self.addresses[i] = Address("tcp", host=a.host, port=sock.getsockname()[1])
                elif a.kind == "fd":
                    self._check_fd(a.fd)
                    # Not passed on to a program the application runs (sd_listen_fds() sets
                    # FD_CLOEXEC the same way); forked worker processes keep it all the same.
                    os.set_inheritable(a.fd, False)
        except BaseException:
            self.close()
            raise
        if self.systemd:
            # Consumed: a child the application starts must not take them for its own
            # (sd_listen_fds(1) unsets them the same way).
            for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
                os.environ.pop(name, None)

    def engine_listen(self) -> list[tuple[str, int] | int]:
        """The ``listen`` argument of cyserve._core.Server, in the addresses' order (open()
        first)."""
        out: list[tuple[str, int] | int] = []
        sockets = iter(self._sockets)
        for a in self.addresses:
            if a.kind == "tcp" and not self.share_tcp:
                out.append((a.host, a.port))
            elif a.kind in ("unix", "tcp"):
                out.append(next(sockets).fileno())
            else:
                out.append(a.fd)
        return out

    def close(self) -> None:
        """Close the Unix sockets and remove their files (only in the process that made them:
        a forked worker that closes its copies leaves the files to its supervisor)."""
        for s in self._sockets:
            s.close()
        self._sockets.clear()
        if os.getpid() == self._owner:
            for path, ident in self._made_paths:
                try:
                    # Only the file this process made: after a restart the path may already be
                    # the next server's socket, which must not vanish under it.
                    st = os.lstat(path)
                    if (st.st_dev, st.st_ino) == ident:
                        os.unlink(path)
                except OSError:
                    pass
        self._made_paths.clear()

    def _open_unix(self, path: str) -> socket.socket:
        _remove_stale_socket(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
        except OSError as exc:
            sock.close()
            raise _unix_error(path, exc) from None
        try:
            st = os.lstat(path)
            self._made_paths.append((path, (st.st_dev, st.st_ino)))
        except OSError:
            pass
        try:
            if self.owner is not None:
                os.chown(path, *self.owner)
            if self.uds_perms is not None:
                # Before listen(): until then a connect() is refused, so no client gets through
                # with the mode bind() left (the umask's).
                os.chmod(path, self.uds_perms)
            sock.listen(self.backlog)
        except OSError as exc:
            sock.close()
            raise _unix_error(path, exc) from None
        return sock

    def _open_tcp(self, a: Address) -> socket.socket:
        where = a.url()
        try:
            infos = socket.getaddrinfo(a.host, a.port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
        except socket.gaierror as exc:
            raise ListenError(f"cannot listen on {where}: cannot resolve host {a.host}: "
                              f"{exc.strerror}") from None
        family, kind, proto, _, addr = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(self.backlog)
        except OSError as exc:
            sock.close()
            err = ListenError(f"cannot listen on {where}: {_reason(exc)}")
            err.errno = exc.errno
            raise err from None
        return sock

    @staticmethod
    def _check_fd(fd: int) -> None:
        where = f"fd://{fd}"
        try:
            st = os.fstat(fd)
        except OSError as exc:
            err = ListenError(f"cannot listen on {where}: {_reason(exc)} (was the descriptor "
                              "passed to this process?)")
            err.errno = exc.errno
            raise err from None
        if not stat.S_ISSOCK(st.st_mode):
            err = ListenError(f"cannot listen on {where}: it is not a socket")
            err.errno = errno.ENOTSOCK
            raise err
        with socket.socket(fileno=os.dup(fd)) as s:
            accepting = s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            kind = s.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE)
        if kind != socket.SOCK_STREAM or not accepting:
            err = ListenError(f"cannot listen on {where}: it is not a listening stream socket "
                              "(listen() was not called on it)")
            err.errno = errno.EINVAL
            raise err


def _socket_answers(path: str) -> bool:
    """Whether a server listens on the Unix socket at path: True when a connection is accepted
    or pends (a full backlog: the probe gives up after a second, and the server is alive),
    False when it is refused."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        return False
    except (TimeoutError, BlockingIOError):  # EAGAIN: a Unix socket's full backlog
        return True
    except OSError as exc:
        raise _unix_error(path, exc) from None
    finally:
        probe.close()
    return True


def _remove_stale_socket(path: str) -> None:
    """Remove a socket file that nobody listens on (left by a server that was killed); refuse
    anything else that is in the way."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _unix_error(path, exc) from None
    if not stat.S_ISSOCK(st.st_mode):
        err = ListenError(f"cannot listen on unix:{path}: the path exists and is not a socket "
                          "(not removed)")
        err.errno = errno.EADDRINUSE
        raise err
    if not _socket_answers(path):
        # Refused twice, 0.1 s apart: a socket file with nobody behind it, stale. (Once is not
        # enough: a server starting on it binds, then sets the mode, then listens, and refuses
        # connections in between.)
        time.sleep(0.1)
        if not _socket_answers(path):
            os.unlink(path)
            return
    err = ListenError(f"cannot listen on unix:{path}: another server is listening on it")
    err.errno = errno.EADDRINUSE
    raise err


def _reason(exc: OSError) -> str:
    text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]


def _unix_error(path: str, exc: OSError) -> ListenError:
    err = ListenError(f"cannot listen on unix:{path}: {_reason(exc)}")
    err.errno = exc.errno
    return err
