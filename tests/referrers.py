"""OCI 1.1's referrers API for tests (Debian's docker-registry has none): tests/registry.py's RegistryProxy,
with `controls.serve_referrers`, remembers each manifest with a `subject` pushed through it and answers
`GET /v2/<name>/referrers/<digest>` with an image index of them, filtered by `artifactType` as the
distribution spec says (and the `OCI-Filters-Applied` header)."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from urllib.parse import parse_qs, urlsplit

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
_REFERRERS = re.compile(r"/v2/(?P<name>.+)/referrers/(?P<digest>sha256:[0-9a-f]{64})")
_MANIFEST = re.compile(r"/v2/(?P<name>.+)/manifests/[^/]+")


class Referrers:
    def __init__(self) -> None:
        self._by_subject: dict[tuple[str, str], list[dict[str, object]]] = {}
        self._lock = threading.Lock()

    def saw_put(self, method: str, path: str, body: bytes | None) -> None:
        """A manifest the registry accepted: indexed under its subject, if it has one."""
        match = _MANIFEST.fullmatch(path)
        if method != "PUT" or match is None or not body:
            return
        try:
            manifest = json.loads(body)
            subject = manifest["subject"]["digest"]
        except (ValueError, KeyError, TypeError):
            return
        descriptor = {
            "mediaType": manifest.get("mediaType"),
            "digest": "sha256:" + hashlib.sha256(body).hexdigest(),
            "size": len(body),
            "artifactType": manifest.get("artifactType") or manifest.get("config", {}).get("mediaType"),
        }
        with self._lock:
            self._by_subject.setdefault((match["name"], subject), []).append(descriptor)

    def answer(self, method: str, raw_path: str) -> tuple[int, dict[str, str], bytes] | None:
        split = urlsplit(raw_path)
        match = _REFERRERS.fullmatch(split.path)
        if method != "GET" or match is None:
            return None
        wanted = parse_qs(split.query).get("artifactType", [None])[0]
        with self._lock:
            listed = list(self._by_subject.get((match["name"], match["digest"]), []))
        headers = {"Content-Type": OCI_INDEX}
        if wanted is not None:
            listed = [d for d in listed if d["artifactType"] == wanted]
            headers["OCI-Filters-Applied"] = "artifactType"
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": listed}
        return 200, headers, json.dumps(index).encode()
