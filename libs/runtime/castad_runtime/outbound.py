"""Every HTTP call that leaves Castad, through one guarded client.

A provider's API, the files a provider hands back and a tenant's webhook receiver are all
reached through `Client`, which:

- sends only to https URLs without credentials in them (plain http as well when `allow_private`);
- resolves the host itself, checks every address the name has (none may be private, loopback,
  link-local, multicast, reserved or shared, nor an IPv6 address carrying such an IPv4 one:
  IPv4-mapped or -compatible, NAT64, 6to4, Teredo) and connects to a checked address: the
  connection is pinned there, with no second lookup, so a name that changes its address
  between the check and the connection (DNS rebinding) reaches nothing inside;
- follows a GET's redirects by hand when the caller allows some, each checked the same way,
  never from https down to http and without the caller's headers on another origin;
- asks for and accepts the identity encoding only (no compressed answer that grows past its cap
  in one chunk), and reads an answer up to a size cap within a deadline for the whole of it;
- ends the whole exchange at the caller's deadline (`Client.stream`'s `deadline`): connecting, the TLS
  handshake, sending and the answer's headers too, for each wait of the connection lasts only as long as the
  deadline leaves (a server that drips its headers a byte at a time holds no thread past it). The name's
  lookup before it is bounded by the system's resolver (its timeout and attempts), not by the deadline.

The check happens where the connection is made: httpx's own transport, whose connection pool
gets a network backend that resolves, checks and connects (httpcore's `NetworkBackend`; the
approach of langflow's `SSRFProtectedTransport`). TLS still verifies the certificate against
the name in the URL, which is also the pool's key, so a kept-alive connection serves one host.

`allow_private` (CASTAD_<STAGE>_ALLOW_PRIVATE, CASTAD_API_WEBHOOK_ALLOW_PRIVATE) is for local
fakes and tests only: it lets private addresses and plain http through.

Failures besides httpx's own (a timeout, a refused connection):

    OutboundError
    ├── Refused            the destination is not allowed (scheme, credentials, address)
    ├── TooManyRedirects   more redirects than the caller allows
    ├── TooLarge           the answer is larger than its cap
    └── EncodingRefused    the answer came encoded (gzip, br, ...) though only identity was asked for
"""

from __future__ import annotations

import contextlib
import contextvars
import ipaddress
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import IO, Any

import httpcore
import httpx

from castad_runtime import db

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
REDIRECTS = frozenset({301, 302, 303, 307, 308})
_ANY_ORIGIN = frozenset({"user-agent", "accept-encoding"})  # the headers a redirect to another origin keeps
# IPv6 ranges that carry an IPv4 address in their last 32 bits: NAT64 (RFC 6052), IPv4-compatible, SIIT.
_EMBEDDING_IPV4 = tuple(ipaddress.IPv6Network(net) for net in ("64:ff9b::/96", "::/96", "::ffff:0:0:0/96"))
# IPv6 ranges never public whatever Python's tables say: local-use NAT64 (RFC 8215), site-local.
_NEVER_PUBLIC = tuple(ipaddress.IPv6Network(net) for net in ("64:ff9b:1::/48", "fec0::/10"))


class OutboundError(Exception):
    """A call that leaves Castad was not made, or its answer not taken."""


class Refused(OutboundError):
    """The destination is not allowed: not https, credentials in the URL, or not a public address."""


class TooManyRedirects(OutboundError):
    """The answer redirected more often than the caller allows."""


class TooLarge(OutboundError):
    """The answer is larger than its cap."""


class EncodingRefused(OutboundError):
    """The answer came with a content encoding other than identity."""


def is_public(address: IPAddress) -> bool:
    """Whether an address is on the public internet (and no IPv4 address it carries is not)."""
    if isinstance(address, ipaddress.IPv6Address):
        if any(address in net for net in _NEVER_PUBLIC):
            return False
        embedded = [address.ipv4_mapped, address.sixtofour, *(address.teredo or ())]
        embedded += [ipaddress.IPv4Address(int(address) & 0xFFFFFFFF) for net in _EMBEDDING_IPV4 if address in net]
        if any(inner is not None and not is_public(inner) for inner in embedded):
            return False
    return address.is_global and not address.is_multicast


def is_local_name(host: str) -> bool:
    """Whether a name stands for this machine whatever DNS says (RFC 6761)."""
    host = host.lower().rstrip(".")
    return host == "localhost" or host.endswith(".localhost")


def check_url(url: str | httpx.URL, allow_private: bool) -> httpx.URL:
    """Return the URL parsed; Refused unless it may be sent to, as far as can be told before a lookup."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as error:
        raise Refused(f"not a URL: {error}") from None
    allowed = ("https", "http") if allow_private else ("https",)
    if parsed.scheme not in allowed:
        raise Refused(f"not an {' or '.join(allowed)} URL")
    if not parsed.host:
        raise Refused("a URL without a host")
    if parsed.userinfo:
        raise Refused("a URL with credentials in it")
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise Refused(f"port {parsed.port} is not a port")
    if not allow_private:
        if is_local_name(parsed.host):
            raise Refused(f"{parsed.host} is this machine")
        try:
            literal = ipaddress.ip_address(parsed.host)
        except ValueError:
            return parsed  # a name: its addresses are checked when it is resolved
        if not is_public(literal):
            raise Refused(f"{literal} is not a public address")
    return parsed


def _lookup(host: str, port: int) -> list[Any]:
    """getaddrinfo, as one place tests can replace (a name server that changes its answers)."""
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)


def addresses(host: str, port: int, allow_private: bool) -> list[IPAddress]:
    """The host's addresses, every one checked: Refused if any is not public (unless allowed)."""
    if not allow_private and is_local_name(host):
        raise Refused(f"{host} is this machine")
    try:
        found = _lookup(host, port)
    except (socket.gaierror, UnicodeError) as error:
        raise httpcore.ConnectError(f"cannot resolve {host}: {getattr(error, 'strerror', error)}") from None
    resolved = [ipaddress.ip_address(info[4][0]) for info in found]
    if not resolved:
        raise httpcore.ConnectError(f"{host} has no address")
    refused = [address for address in resolved if not is_public(address)]
    if refused and not allow_private:
        raise Refused(f"{host} resolves to {refused[0]}, not a public address")
    return resolved


# The deadline of the exchange under way in this thread (`Client.stream`), which every read and write of its
# connection keeps to (`_DeadlineStream`).
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("outbound_deadline", default=None)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every wait ends by the deadline of the exchange under way, if it has one."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    @staticmethod
    def _left(timeout: float | None, late: type[httpcore.TimeoutException]) -> float | None:
        deadline = _deadline.get()
        if deadline is None:
            return timeout
        left = deadline - time.monotonic()
        if left <= 0:
            raise late("the exchange took longer than its deadline")
        return left if timeout is None else min(timeout, left)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        left = self._left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, left))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _CheckedBackend(httpcore.NetworkBackend):
    """httpcore's sockets, made only to addresses `addresses` checked, in the order the resolver gave."""

    def __init__(self, allow_private: bool) -> None:
        self._allow_private = allow_private
        self._sockets = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        failed: Exception | None = None
        for address in addresses(host, port, self._allow_private):
            try:
                left = _DeadlineStream._left(timeout, httpcore.ConnectTimeout)
                stream = self._sockets.connect_tcp(str(address), port, left, local_address, socket_options)
                return _DeadlineStream(stream)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as error:
                failed = error
        assert failed is not None
        raise failed

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise Refused("a Unix socket is not a destination")

    def sleep(self, seconds: float) -> None:
        self._sockets.sleep(seconds)


class CheckedTransport(httpx.HTTPTransport):
    """httpx's transport whose every connection goes to a checked, pinned address."""

    def __init__(self, allow_private: bool, limits: httpx.Limits) -> None:
        super().__init__(limits=limits)
        # HTTPTransport takes no network backend: its pool is replaced by the same one with ours.
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_CheckedBackend(allow_private),
        )


class Client:
    """An HTTP client for calls that leave Castad (see the module's docstring).

    `transport` replaces the checked one (tests answering in memory): URLs are still checked,
    addresses are not, as nothing is connected to."""

    def __init__(
        self,
        *,
        allow_private: bool,
        timeout_s: float,
        base_url: str = "",
        keepalive: bool = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if base_url:
            check_url(base_url, allow_private)
        self.allow_private = allow_private
        limits = httpx.Limits(max_keepalive_connections=None if keepalive else 0)
        self._client = httpx.Client(
            base_url=base_url.rstrip("/") + "/" if base_url else "",
            timeout=httpx.Timeout(timeout_s),
            follow_redirects=False,
            trust_env=False,  # no proxy or netrc from the environment: a proxy would connect where it likes
            transport=transport or CheckedTransport(allow_private, limits),
            headers={"user-agent": "castad", "accept-encoding": "identity"},
        )

    def close(self) -> None:
        self._client.close()

    @contextlib.contextmanager
    def stream(
        self,
        method: str,
        url: str,
        *,
        max_redirects: int = 0,
        headers: Mapping[str, str] | None = None,
        deadline: float | None = None,
        **kwargs: Any,
    ) -> Iterator[httpx.Response]:
        """Send a request and yield its answer, body unread; a GET follows up to `max_redirects` redirects.

        A redirect past the last one allowed is TooManyRedirects; with none allowed, for another
        method or without a location, the 3xx answer itself is yielded. Every hop is checked as the
        first one was. The whole exchange, until the block ends, keeps to `deadline` (monotonic; None: each wait
        only to the client's timeout): past it, a wait of the connection ends in httpx's timeout."""
        token = _deadline.set(deadline)
        try:
            with self._exchange(method, url, max_redirects, headers, **kwargs) as response:
                yield response
        finally:
            _deadline.reset(token)

    @contextlib.contextmanager
    def _exchange(
        self, method: str, url: str, max_redirects: int, headers: Mapping[str, str] | None, **kwargs: Any
    ) -> Iterator[httpx.Response]:
        request = self._client.build_request(method, url, headers=headers, **kwargs)
        response = self._send(request)
        try:
            hops = 0
            while (
                response.status_code in REDIRECTS
                and response.headers.get("location")
                and method in ("GET", "HEAD")
                and max_redirects
            ):
                hops += 1
                if hops > max_redirects:
                    raise TooManyRedirects(f"more than {max_redirects} redirects")
                request = self._redirected(request, response)
                response.close()
                response = self._send(request)
            yield response
        finally:
            response.close()

    def _send(self, request: httpx.Request) -> httpx.Response:
        db.outside(f"a call to {request.url.host}")
        check_url(request.url, self.allow_private)
        return self._client.send(request, stream=True)

    def _redirected(self, request: httpx.Request, response: httpx.Response) -> httpx.Request:
        try:
            target = request.url.join(response.headers.get("location", ""))
        except httpx.InvalidURL as error:
            raise Refused(f"a redirect to something not a URL: {error}") from None
        if request.url.scheme == "https" and target.scheme != "https":
            raise Refused("a redirect from https down to http")
        origin = (target.scheme, target.host, target.port)
        kept = _ANY_ORIGIN if origin != (request.url.scheme, request.url.host, request.url.port) else None
        headers = {
            name: value
            for name, value in request.headers.items()
            if name.lower() != "host" and (kept is None or name.lower() in kept)
        }
        return self._client.build_request(request.method, target, headers=headers)


def read(response: httpx.Response, max_bytes: int, deadline: float) -> bytes:
    """Return a streamed answer's body.

    TooLarge past `max_bytes`, httpx.ReadTimeout past `deadline` (monotonic; a server trickling bytes would
    otherwise hold the connection for as long as it likes), EncodingRefused for an encoded one.
    """
    body = bytearray()
    _copy(response, body.extend, max_bytes, deadline)
    return bytes(body)


def write_to(response: httpx.Response, out: IO[bytes], max_bytes: int, deadline: float) -> int:
    """Write a streamed answer's body to `out`, as `read` reads it; how many bytes."""
    return _copy(response, out.write, max_bytes, deadline)


def _copy(response: httpx.Response, write: Callable[[bytes], object], max_bytes: int, deadline: float) -> int:
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise EncodingRefused(f"the answer is encoded as {encoding[:40]!r}")
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise TooLarge(f"the answer declares {declared} bytes, more than {max_bytes}")
    size = 0
    for chunk in response.iter_bytes():  # identity only (`Client.stream`): the bytes as they came
        size += len(chunk)
        if size > max_bytes:
            raise TooLarge(f"the answer is larger than {max_bytes} bytes")
        if time.monotonic() > deadline:
            raise httpx.ReadTimeout("the answer took longer than its deadline", request=response.request)
        write(chunk)
    return size
