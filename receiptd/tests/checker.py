#!/usr/bin/env python3
"""An independent checker of warren receipt exports, proofs and checkpoints.

Written from RFC 9162 (Merkle tree hash, inclusion and consistency proof verification, sections
2.1.1, 2.1.3.2 and 2.1.4.2), the C2SP signed-note and tlog-checkpoint specs, DSSE v1 (PAE) and
RFC 7638 (JWK thumbprint), not from the Rust code. Ed25519 comes from `cryptography`.

usage: checker.py EXPORT REGISTRY PROOFS
  PROOFS: JSON lines, each an inclusion proof ({"seq","tree_size","leaf_hash","path","checkpoint"})
  or a consistency proof ({"old_size","new_size","proof","checkpoint"}).
Exit 0 when everything checks, 1 with a message otherwise.
"""

import base64
import hashlib
import json
import sys

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


class Bad(Exception):
    pass


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64url_decode(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def sha256(data):
    return hashlib.sha256(data).digest()


# RFC 9162 2.1.1
def leaf_hash(data):
    return sha256(b"\x00" + data)


def node_hash(left, right):
    return sha256(b"\x01" + left + right)


def mth(leaves):
    n = len(leaves)
    if n == 0:
        return sha256(b"")
    if n == 1:
        return leaves[0]
    k = 1
    while k * 2 < n:
        k *= 2
    return node_hash(mth(leaves[:k]), mth(leaves[k:]))


# RFC 9162 2.1.3.2
def verify_inclusion(leaf_index, tree_size, leaf, path, root):
    if leaf_index >= tree_size:
        return False
    fn, sn = leaf_index, tree_size - 1
    r = leaf
    for p in path:
        if sn == 0:
            return False
        if fn % 2 == 1 or fn == sn:
            r = node_hash(p, r)
            if fn % 2 == 0:
                while not (fn % 2 == 1 or fn == 0):
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


# RFC 9162 2.1.4.2
def verify_consistency(first, second, first_hash, second_hash, proof):
    if first == second:
        return len(proof) == 0 and first_hash == second_hash
    if first == 0 or first > second or not proof:
        return False
    path = list(proof)
    if first & (first - 1) == 0:  # a power of two
        path.insert(0, first_hash)
    fn, sn = first - 1, second - 1
    while fn % 2 == 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn % 2 == 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if fn % 2 == 0:
                while not (fn % 2 == 1 or fn == 0):
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return fr == first_hash and sr == second_hash and sn == 0


def load_registry(raw):
    reg = json.loads(raw)
    keys = {}
    for row in reg["keys"]:
        if row["alg"] != "Ed25519":
            raise Bad("registry: unsupported alg %r" % row["alg"])
        pk = b64url_decode(row["public_key"])
        # RFC 7638: required members only, lexicographic order, no whitespace.
        jwk = '{"crv":"Ed25519","kty":"OKP","x":"%s"}' % b64url(pk)
        if b64url(sha256(jwk.encode())) != row["keyid"]:
            raise Bad("registry: keyid %s is not the thumbprint of its key" % row["keyid"])
        keys[row["keyid"]] = (row, Ed25519PublicKey.from_public_bytes(pk), pk)
    return keys


def check_note(note, keys, leaves):
    """C2SP signed note + tlog-checkpoint; returns (size, root)."""
    if "\n\n" not in note:
        raise Bad("checkpoint without a blank line")
    text, sigs = note.split("\n\n", 1)
    text += "\n"
    lines = text.split("\n")[:-1]
    if len(lines) < 3:
        raise Bad("checkpoint has fewer than 3 lines")
    size = int(lines[1])
    root = base64.b64decode(lines[2], validate=True)
    verified = False
    for line in sigs.split("\n"):
        if not line:
            continue
        if not line.startswith("\u2014 "):
            raise Bad("signature line without an em dash: %r" % line)
        name, blob = line[2:].rsplit(" ", 1)
        blob = base64.b64decode(blob, validate=True)
        for row, key, pk in keys.values():
            if row["note_name"] != name:
                continue
            if sha256(name.encode() + b"\n" + b"\x01" + pk)[:4] != blob[:4]:
                continue
            try:
                key.verify(blob[4:], text.encode())
                verified = True
            except InvalidSignature:
                raise Bad("checkpoint signature does not verify (size %d)" % size)
    if not verified:
        raise Bad("checkpoint of size %d: no signature by a registry key" % size)
    if size > len(leaves) or mth(leaves[:size]) != root:
        raise Bad("checkpoint root of size %d does not match the export's entries" % size)
    return size, root


def pae(payload_type, payload):
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def main(export_path, registry_path, proofs_path):
    keys = load_registry(open(registry_path, "rb").read())
    raw = open(export_path, "rb").read()
    entries, notes = [], []
    for line in raw.split(b"\n")[:-1]:
        obj = json.loads(line)
        if "checkpoint" in obj:
            notes.append(obj["checkpoint"])
        else:
            entries.append((line, obj))
    leaves = [leaf_hash(line) for line, _ in entries]
    prev = "0" * 64
    for i, (line, env) in enumerate(entries):
        payload = base64.b64decode(env["payload"], validate=True)
        body = json.loads(payload)
        if body["seq"] != i or body["prev"] != prev:
            raise Bad("entry %d: chain broken" % i)
        if body["kind"] != "query":
            (sig,) = env["signatures"]
            try:
                keys[sig["keyid"]][1].verify(base64.b64decode(sig["sig"]), pae(env["payloadType"], payload))
            except (InvalidSignature, KeyError):
                raise Bad("entry %d: DSSE signature does not verify" % i)
        prev = sha256(line).hex()
    sizes = {}
    for note in notes:
        size, root = check_note(note, keys, leaves)
        sizes[size] = root
    if max(sizes) != len(entries):
        raise Bad("the latest checkpoint does not cover every entry")
    n_inc = n_con = 0
    for line in open(proofs_path, "rb").read().split(b"\n"):
        if not line.strip():
            continue
        p = json.loads(line)
        size, root = check_note(p["checkpoint"], keys, leaves)
        if "seq" in p:
            path = [bytes.fromhex(h) for h in p["path"]]
            if p["tree_size"] != size or not verify_inclusion(p["seq"], size, leaves[p["seq"]], path, root):
                raise Bad("inclusion proof of seq %d in size %d does not verify" % (p["seq"], size))
            n_inc += 1
        else:
            old = p["old_size"]
            proof = [bytes.fromhex(h) for h in p["proof"]]
            if p["new_size"] != size or not verify_consistency(old, size, mth(leaves[:old]), root, proof):
                raise Bad("consistency proof %d -> %d does not verify" % (old, size))
            n_con += 1
    print("checker: OK: %d entries, %d checkpoints, %d inclusion and %d consistency proofs"
          % (len(entries), len(notes), n_inc, n_con))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    try:
        main(*sys.argv[1:])
    except (Bad, ValueError, KeyError) as e:
        print("checker: FAILED: %s" % e, file=sys.stderr)
        sys.exit(1)
