"""One call of E2B's control-plane REST API with Python's standard library,
as E2B's Python SDK makes it (JSON bodies, X-API-Key).

usage: e2b_rest.py METHOD URL API_KEY [JSON_BODY]

Prints one JSON object: {"status": N, "next_token": "...", "body": <JSON or null>}.
"""
import json
import sys
import urllib.error
import urllib.request


def main():
    method, url, key = sys.argv[1], sys.argv[2], sys.argv[3]
    data = None
    headers = {"X-API-Key": key, "Accept": "application/json"}
    if len(sys.argv) > 4:
        data = json.dumps(json.loads(sys.argv[4])).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as res:
            status, raw, hdrs = res.status, res.read(), res.headers
    except urllib.error.HTTPError as e:
        status, raw, hdrs = e.code, e.read(), e.headers
    body = json.loads(raw) if raw.strip() else None
    print(json.dumps({"status": status, "next_token": hdrs.get("X-Next-Token") or "", "body": body}))


if __name__ == "__main__":
    main()
