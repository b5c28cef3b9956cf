"""Another local user for two-uid tests: uid 65534 (nobody), reached with setpriv, which needs root."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

OTHER_UID = 65534  # nobody


def need_root(what: str) -> None:
    if os.geteuid() != 0:
        pytest.fail(f"this test {what}, which needs root", pytrace=False)


def as_other_user(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    need_root("runs a command as another user with setpriv")
    command = ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


def other_user_process(*argv: str) -> subprocess.Popen[str]:
    """A process of the other user that keeps running (a listener), its stdout piped."""
    need_root("runs a process as another user with setpriv")
    command = ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", *argv]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


# One HTTP request; an answer without a Content-Length (a followed log or event stream) is read only up to
# its first bytes, so that following something does not wait for its end.
REQUEST = r"""
import json, sys, urllib.error, urllib.request
url, method, body, headers = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
request = urllib.request.Request(url, data=body.encode() if body else None, headers=headers, method=method)
try:
    with urllib.request.urlopen(request, timeout=60) as response:
        sized = response.headers.get("Content-Length") is not None
        text = (response.read() if sized else response.read1(65536)).decode()
        print(json.dumps({"status": response.status, "body": text}))
except urllib.error.HTTPError as error:
    print(json.dumps({"status": error.code, "body": error.read().decode()}))
"""


def request_as_other_user(
    method: str, url: str, body: object = None, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    """(status, body) of one request the other user sends; `body` is sent as JSON."""
    headers = {**({"Content-Type": "application/json"} if body is not None else {}), **(headers or {})}
    text = json.dumps(body) if body is not None else ""
    result = as_other_user(sys.executable, "-c", REQUEST, url, method, text, json.dumps(headers))
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    return answer["status"], answer["body"]


def post_as_other_user(url: str, body: object, headers: dict[str, str] | None = None) -> tuple[int, str]:
    return request_as_other_user("POST", url, body, headers)
