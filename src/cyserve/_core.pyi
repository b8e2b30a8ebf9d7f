"""Type stubs for the Python-visible part of cyserve._core (the engine's Cython layer)."""

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, Optional, Union

RouteKind = Literal["python", "nogil", "static", "files"]
RouteMatch = Literal["path", "prefix", "regex"]
Route = tuple[RouteMatch, str, Optional[tuple[str, ...]], RouteKind, Any]

class Headers(Mapping[str, str]):
    def __getitem__(self, key: str) -> str: ...
    def __iter__(self) -> Iterator[str]: ...
    def __len__(self) -> int: ...

class Request:
    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def query(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def http_version(self) -> str: ...
    @property
    def headers(self) -> Headers: ...
    @property
    def body(self) -> bytes: ...
    @property
    def params(self) -> dict[str, Union[int, str]]: ...
    @property
    def client(self) -> Optional[tuple[str, int]]: ...
    @property
    def scheme(self) -> str: ...

class Response:
    body: Union[bytes, bytearray, memoryview, str]
    status: int
    headers: Optional[Union[Mapping[str, str], Sequence[tuple[str, str]]]]
    content_type: Optional[str]
    def __init__(
        self,
        body: Union[bytes, bytearray, memoryview, str] = b"",
        status: int = 200,
        headers: Optional[Union[Mapping[str, str], Sequence[tuple[str, str]]]] = None,
        content_type: Optional[str] = None,
    ) -> None: ...

HandlerResult = Union[str, bytes, dict[str, Any], list[Any], Response, None]

def check_tls(
    ssl_certfile: str,
    ssl_keyfile: Optional[str] = None,
    ssl_keyfile_password: Optional[str] = None,
    ssl_ciphers: Optional[str] = None,
    ssl_ca_certs: Optional[str] = None,
    ssl_cert_reqs: int = 0,
) -> None: ...

class Metrics:
    def __init__(self, nprocs: int, nshards: int) -> None: ...
    @property
    def nshards(self) -> int: ...
    def claim(self, pid: int) -> int: ...
    def retire(self, slot: int) -> None: ...
    def health(self, slot: int) -> tuple[int, int]: ...
    def text(self) -> bytes: ...
    def serve(self, fd: int) -> None: ...
    def close(self) -> None: ...

class Server:
    host: str
    threads: int
    def __init__(
        self,
        routes: list[Route],
        *,
        host: str,
        port: int,
        threads: int,
        backlog: int = 1024,
        max_header_bytes: int = 8192,
        max_target_bytes: int = 8192,
        max_headers: int = 100,
        max_body_bytes: int = 1048576,
        keepalive_timeout: float = 5.0,
        header_timeout: float = 10.0,
        body_timeout: float = 10.0,
        shared_port: bool = False,
        access_log: bool = False,
        blocking_threads: int = 16,
        body_budget: int = 67108864,
        min_body_rate: int = 500,
        listen: Optional[Sequence[Union[tuple[str, int], int]]] = None,
        forwarded_allow_ips: Optional[str] = None,
        ssl_certfile: Optional[str] = None,
        ssl_keyfile: Optional[str] = None,
        ssl_keyfile_password: Optional[str] = None,
        ssl_ciphers: Optional[str] = None,
        ssl_ca_certs: Optional[str] = None,
        ssl_cert_reqs: int = 0,
        metrics: Optional[Metrics] = None,
        metrics_slot: int = -1,
        proxy_protocol_from: Optional[str] = None,
    ) -> None: ...
    @property
    def scheme(self) -> str: ...
    def start(self) -> None: ...
    def stop(self, grace: float = 5.0) -> None: ...
    @property
    def running(self) -> bool: ...
    @property
    def port(self) -> int: ...
    @property
    def ports(self) -> list[int]: ...
    @property
    def live_connections(self) -> int: ...
    def stats(self) -> dict[str, int]: ...
    @property
    def requests(self) -> int: ...

def __getattr__(name: str) -> Any: ...
