#!/usr/bin/env python3
"""Writes a byte-level GPT-2 vocabulary in which every byte is a token and nothing is merged:
VOCAB (GPT-2's vocab.json form, <|endoftext|> last) and MERGES (no merges), for tests that need
GPT2BPETokenizer files without GPT-2's. Usage: make_byte_vocab.py VOCAB MERGES"""
import json
import sys


def main():
    vocab_path, merges_path = sys.argv[1:3]
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(c): i for i, c in enumerate(cs)}
    vocab["<|endoftext|>"] = len(vocab)
    with open(vocab_path, "w") as f:
        json.dump(vocab, f)
    with open(merges_path, "w") as f:
        f.write("#version: 0.2\n")


if __name__ == "__main__":
    main()
