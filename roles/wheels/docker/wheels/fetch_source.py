"""Fetch a package's source distribution from a PyPI-compatible index and unpack it.

    fetch_source.py PACKAGE VERSION DEST

Uses the index's JSON API (PEP 691 / warehouse) instead of `pip download`, which would run the
package's setup.py just to read metadata. The sdist's sha256 from the index is checked.
"""

import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.request


def sdist_url(package: str, version: str) -> tuple[str, str]:
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    base = index[: -len("/simple")] if index.endswith("/simple") else index
    with urllib.request.urlopen(f"{base}/pypi/{package}/{version}/json", timeout=120) as reply:
        release = json.load(reply)
    for item in release["urls"]:
        if item["packagetype"] == "sdist":
            return item["url"], item["digests"]["sha256"]
    sys.exit(f"fetch_source: {package} {version} has no source distribution on {base}")


def main(package: str, version: str, dest: str) -> None:
    url, sha256 = sdist_url(package, version)
    print(f"fetch_source: {package} {version} from {url}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        archive = os.path.join(tmp, "sdist.tar.gz")
        with urllib.request.urlopen(url, timeout=600) as reply, open(archive, "wb") as out:
            shutil.copyfileobj(reply, out)
        digest = hashlib.sha256(open(archive, "rb").read()).hexdigest()
        if digest != sha256:
            sys.exit(f"fetch_source: sha256 mismatch for {url}: {digest} != {sha256}")
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(tmp)
        (top,) = [d for d in os.listdir(tmp) if os.path.isdir(os.path.join(tmp, d))]
        shutil.move(os.path.join(tmp, top), dest)


if __name__ == "__main__":
    main(*sys.argv[1:4])
