#!/usr/bin/env python3
"""Sign an image in a registry the cosign way, with nothing but openssl.

    openssl-sign.py KEY.pem REGISTRY REPO DIGEST

Writes the simple-signing payload for DIGEST, signs it with `openssl dgst
-sha256 -sign KEY.pem` (ECDSA P-256, DER), uploads the payload and an empty
config as blobs and puts the `.sig` manifest under the cosign tag
`sha256-<hex>.sig` (plain HTTP: the e2e registry is on 127.0.0.1).

It is the e2e's independent signer (scenario `openssl_signer`): it shows
that the activator accepts a signature no kubeslot code produced, and only
under the key that made it. It does not generate keys (openssl does) and
does not verify anything.
"""

import base64
import hashlib
import json
import subprocess
import sys
import urllib.request


def put_blob(registry: str, repo: str, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    start = urllib.request.Request(
        f"http://{registry}/v2/{repo}/blobs/uploads/", method="POST", data=b""
    )
    with urllib.request.urlopen(start) as r:
        location = r.headers["Location"]
    if location.startswith("/"):
        location = f"http://{registry}{location}"
    sep = "&" if "?" in location else "?"
    put = urllib.request.Request(
        f"{location}{sep}digest={digest}",
        method="PUT",
        data=data,
        headers={"Content-Type": "application/octet-stream"},
    )
    with urllib.request.urlopen(put) as r:
        if r.status not in (201, 202):
            sys.exit(f"openssl-sign: blob {digest} upload to {registry}/{repo}: HTTP {r.status}")
    return digest


def main() -> None:
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    key, registry, repo, digest = sys.argv[1:]
    payload = json.dumps(
        {
            "critical": {
                "identity": {"docker-reference": f"{registry}/{repo}"},
                "image": {"docker-manifest-digest": digest},
                "type": "cosign container image signature",
            },
            "optional": None,
        },
        separators=(",", ":"),
    ).encode()
    der = subprocess.run(
        ["openssl", "dgst", "-sha256", "-sign", key],
        input=payload,
        capture_output=True,
        check=True,
    ).stdout
    config = b"{}"
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": put_blob(registry, repo, config),
            "size": len(config),
        },
        "layers": [
            {
                "mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
                "digest": put_blob(registry, repo, payload),
                "size": len(payload),
                "annotations": {
                    "dev.cosignproject.cosign/signature": base64.b64encode(der).decode()
                },
            }
        ],
    }
    tag = digest.replace(":", "-") + ".sig"
    req = urllib.request.Request(
        f"http://{registry}/v2/{repo}/manifests/{tag}",
        method="PUT",
        data=json.dumps(manifest).encode(),
        headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"},
    )
    with urllib.request.urlopen(req) as r:
        if r.status != 201:
            sys.exit(f"openssl-sign: manifest {registry}/{repo}:{tag}: HTTP {r.status}")
    print(f"{registry}/{repo}:{tag}")


if __name__ == "__main__":
    main()
