"""The Pulsar admin REST client of the backend (topics, namespaces, policies, stats): JSON over
HTTP(S), following a broker's redirect to a topic's owner; failures raise ``_HttpError``,
translated by :func:`idempotent.adapters.pulsar.errors.translate`."""

from __future__ import annotations

import contextlib
import itertools
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from idempotent.adapters.pulsar.errors import _HttpError


class _KeepMethodRedirects(urllib.request.HTTPRedirectHandler):
    """Follow 307/308 (a broker redirecting to a topic's owner) with the same method and body."""

    def redirect_request(
        self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        if code in (307, 308):
            return urllib.request.Request(
                newurl, data=req.data, headers=dict(req.header_items()), method=req.get_method()
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_NO_BODY = object()


class Admin:
    def __init__(
        self, base_url: str, headers: dict[str, str], timeout: float, context: ssl.SSLContext | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"Accept": "application/json", **headers}
        self.timeout = timeout
        handlers: list[urllib.request.BaseHandler] = [_KeepMethodRedirects()]
        if context is not None:
            handlers.append(urllib.request.HTTPSHandler(context=context))
        self._opener = urllib.request.build_opener(*handlers)

    def call(self, method: str, path: str, body: object = _NO_BODY, *, accept: Sequence[int] = ()) -> tuple[int, Any]:
        """``(status, decoded JSON or None)``; statuses in ``accept`` are returned, not raised."""
        url = self.base_url + urllib.parse.quote(path, safe="/:=?&")
        data = None if body is _NO_BODY else json.dumps(body).encode()
        headers = dict(self.headers)
        if data is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                payload = response.read()
                return int(response.status), json.loads(payload) if payload else None
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            with contextlib.suppress(ValueError, AttributeError):
                text = str(json.loads(text).get("reason", text))
            if exc.code in accept:
                return int(exc.code), text
            raise _HttpError(int(exc.code), text, url) from None

    # -- unloading (what the load balancer does when it moves topics between brokers) --------

    def unload_topic(self, rest: str) -> None:
        """Unload a topic (``rest``: its admin path, ``/admin/v2/persistent/t/ns/topic``; every
        partition of a partitioned one): its broker closes it, its clients reconnect, and the
        next lookup loads it again, on this or another broker.

        Raises:
            _HttpError: the broker refused (404: no such topic).
        """
        self.call("PUT", f"{rest}/unload")

    def bundles(self, namespace: str) -> list[str]:
        """The bundles of ``namespace`` (``tenant/ns``), as ``0x..._0x...`` ranges.

        Raises:
            _HttpError: the broker refused (404: no such namespace).
        """
        _, body = self.call("GET", f"/admin/v2/namespaces/{namespace}/bundles")
        boundaries = list(body["boundaries"]) if isinstance(body, dict) else []
        return [f"{low}_{high}" for low, high in itertools.pairwise(boundaries)]

    def unload_bundle(self, namespace: str, bundle: str | None = None) -> None:
        """Unload one bundle of ``namespace`` (every topic whose name hashes into it), or with
        ``bundle`` None the whole namespace.

        Raises:
            _HttpError: the broker refused.
        """
        where = f"/admin/v2/namespaces/{namespace}" + ("" if bundle is None else f"/{bundle}")
        self.call("PUT", f"{where}/unload")
