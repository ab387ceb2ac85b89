"""Answers the MCP handshake with garbage on stdout, then floods it."""
import sys

sys.stdin.readline()
sys.stdout.write("this is not JSON-RPC\n" + "x" * 100000 + "\n")
sys.stdout.flush()
for _ in range(1000):
    sys.stdout.write("{\"jsonrpc\": \"2.0\", garbage\n")
sys.stdout.flush()
sys.stdin.read()
