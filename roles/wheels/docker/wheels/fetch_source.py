"""Fetch a package's source distribution from a PyPI-compatible index and unpack it.

    fetch_source.py PACKAGE VERSION DEST SHA256

Uses the index's JSON API (PEP 691 / warehouse) instead of `pip download`, which would run the
package's setup.py just to read metadata. The archive must have SHA256, the pin of the stack file
(inventory/stack.yml): a digest from the index that serves the file would vouch for nothing the
index could not change, so the index's is only compared, and a difference refused too.
A mirror's login comes from the netrc file named by NETRC (a BuildKit secret mount: roles/wheels),
the file pip reads too; it is sent to that host, over https only, and never printed.
"""

import base64
import hashlib
import json
import netrc
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from urllib.parse import urlsplit


def authorization(url: str) -> dict:
    """The Basic authorization header for url from the NETRC file, or no header."""
    path = os.environ.get("NETRC")
    parts = urlsplit(url)
    if not path or not os.path.isfile(path) or parts.scheme != "https":
        return {}
    entry = netrc.netrc(path).authenticators(parts.hostname or "")
    if not entry:
        return {}
    login, _, password = entry
    return {"Authorization": "Basic " + base64.b64encode(f"{login}:{password}".encode()).decode()}


def open_url(url: str, timeout: int):
    return urllib.request.urlopen(urllib.request.Request(url, headers=authorization(url)), timeout=timeout)


def sdist_url(package: str, version: str) -> tuple[str, str]:
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    base = index[: -len("/simple")] if index.endswith("/simple") else index
    with open_url(f"{base}/pypi/{package}/{version}/json", timeout=120) as reply:
        release = json.load(reply)
    for item in release["urls"]:
        if item["packagetype"] == "sdist":
            return item["url"], item["digests"]["sha256"]
    sys.exit(f"fetch_source: {package} {version} has no source distribution on {base}")


def main(package: str, version: str, dest: str, pinned: str = "") -> None:
    if len(pinned) != 64:
        sys.exit(f"fetch_source: no sha256 pinned for {package} {version} (got {pinned!r}); refusing to build from it")
    url, sha256 = sdist_url(package, version)
    if sha256 != pinned:
        sys.exit(f"fetch_source: the index lists {package} {version} with sha256 {sha256}, not the pinned {pinned}")
    print(f"fetch_source: {package} {version} from {url}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        archive = os.path.join(tmp, "sdist.tar.gz")
        with open_url(url, timeout=600) as reply, open(archive, "wb") as out:
            shutil.copyfileobj(reply, out)
        digest = hashlib.sha256(open(archive, "rb").read()).hexdigest()
        if digest != pinned:
            sys.exit(f"fetch_source: {url} has sha256 {digest}, not the pinned {pinned}; refusing to build from it")
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(tmp)
        (top,) = [d for d in os.listdir(tmp) if os.path.isdir(os.path.join(tmp, d))]
        shutil.move(os.path.join(tmp, top), dest)


if __name__ == "__main__":
    main(*sys.argv[1:5])
