# Python p9fs (PyPI) against toolfs over a connection handed over with a grant: the socket is
# inherited as fd argv[1]. Prints one JSON object with what it saw; the Rust test asserts on it.
import json
import os
import socket
import sys

import p9fs
from py9p import py9p

FD = int(sys.argv[1])
CALLS = json.loads(sys.argv[2])  # [[tool, args-json], ...]


class InheritedP9(p9fs.P9FileSystem):
    def _connect(self):
        s = socket.socket(fileno=FD)
        self.client = py9p.Client(
            s,
            credentials=py9p.Credentials(user=self.username, passwd=None),
            ver=self.version,
            chatty=False,
            aname=self.aname,
        )


fs = InheritedP9(host="granted", port=0, username="nobody", version="9P2000.L", skip_instance_cache=True)
out = {"root": sorted(n.strip("/") for n in fs.ls("", detail=False)), "tools": fs.cat_file("tools").decode(), "calls": []}
for tool, args in CALLS:
    args = args.encode()
    f = fs._open_fid(tool + "/call", os.O_RDWR)
    # The r+b idiom: write at 0, read at len(args), then read at the end (0 bytes).
    fs._write(args, 0, f)
    result = fs._read(1 << 16, len(args), f)
    tail = fs._read(1 << 16, len(args) + len(result), f)
    fs._release_fid(f)
    out["calls"].append({"tool": tool, "envelope": json.loads(result), "tail": len(tail)})
print(json.dumps(out))
