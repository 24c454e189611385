#!/usr/bin/env python3
"""Builds the real-text corpus of the FP8 convergence runs (scripts/text_corpus/fp8_convergence.sh)
from packages only -- nothing is downloaded at run time:

  text       the Linux kernel's documentation (Debian linux-doc-6.1: Documentation/**/*.gz, reST and
             plain text), Python's (python3.11-doc: the reST sources of its HTML) and Perl's
             (perl-doc: *.pod); one document per file, in a fixed shuffled order (seed 1234) so that
             a split's held-out tail mixes all three sources
  tokenizer  GPT-2's byte-level BPE, from the openai-whisper source distribution on PyPI
             (whisper/assets/gpt2.tiktoken: the 50,256 GPT-2 merge ranks), converted here to the
             vocab.json + merges.txt pair Megatron's GPT2BPETokenizer reads (<|endoftext|> = 50256)

Fetch the inputs where a package registry can be reached, into one folder:
  apt-get download linux-doc-6.1 python3.11-doc perl-doc
  python3 -m pip download --no-deps --no-binary :all: openai-whisper==20250625
then:
  scripts/text_corpus/prepare_corpus.py --packages DIR --out OUT [--preprocess build/fp8tron-preprocess]
which writes OUT/gpt2-vocab.json, OUT/gpt2-merges.txt, OUT/corpus.jsonl and, with the preprocess
tool, OUT/docs_text_document.{bin,idx} (checking first that "Hello world" encodes as GPT-2's
[15496, 995]).
"""
import argparse
import base64
import glob
import gzip
import json
import os
import random
import subprocess
import sys
import tarfile


def bytes_to_unicode():
    """GPT-2's map from bytes to printable characters (its encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def read_tiktoken_ranks(sdist):
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("whisper/assets/gpt2.tiktoken"))
        text = tar.extractfile(member).read().decode()
    ranks = {}
    for line in text.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def merge_of(token, ranks, rank):
    """The two parts a token of `rank` was merged from: byte-level BPE over the token with the
    merges of lower rank only stops at exactly two parts."""
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < rank and (best is None or r < best[1]):
                best = (i, r)
        if best is None:
            break
        i = best[0]
        parts = parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2:]
    if len(parts) != 2:
        raise SystemExit(f"rank {rank} ({token!r}) is not one merge of lower ranks: {parts}")
    return parts


def write_gpt2_files(ranks, out):
    u = bytes_to_unicode()
    text = lambda b: "".join(u[x] for x in b)
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    if [r for _, r in by_rank] != list(range(len(by_rank))) or any(len(t) != 1 for t, r in by_rank[:256]):
        raise SystemExit("gpt2.tiktoken: ranks are not 0..N-1 with the 256 single bytes first")
    vocab = {text(t): r for t, r in by_rank}
    vocab["<|endoftext|>"] = len(by_rank)
    with open(os.path.join(out, "gpt2-vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(out, "gpt2-merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for token, rank in by_rank[256:]:
            a, b = merge_of(token, ranks, rank)
            f.write(f"{text(a)} {text(b)}\n")
    print(f"GPT-2 BPE: {len(vocab)} tokens, {len(by_rank) - 256} merges")


def unpack(deb, into):
    os.makedirs(into, exist_ok=True)
    subprocess.run(["dpkg-deb", "-x", deb, into], check=True)


def documents(root):
    """(path, text) of every document, shuffled with a fixed seed: Megatron's --split takes
    contiguous document ranges, and sorted paths would leave the validation split all Python."""
    files = []
    files += glob.glob(os.path.join(root, "linux", "usr/share/doc/linux-doc-*/Documentation/**/*.gz"), recursive=True)
    files += glob.glob(os.path.join(root, "python", "usr/share/doc/python3*/html/_sources/**/*.txt"), recursive=True)
    files += glob.glob(os.path.join(root, "perl", "usr/share/perl/**/*.pod"), recursive=True)
    files.sort()
    random.Random(1234).shuffle(files)
    for path in files:
        raw = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
        text = raw.decode("utf-8", errors="replace").strip()
        if len(text) >= 200:
            yield path, text


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--packages", required=True, help="folder with the three .deb files and the openai-whisper sdist")
    p.add_argument("--out", required=True)
    p.add_argument("--preprocess", help="build/fp8tron-preprocess: also tokenize into OUT/docs_text_document")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    find = lambda pattern: (glob.glob(os.path.join(a.packages, pattern)) or [None])[0]
    inputs = {"linux": find("linux-doc-6.1_*.deb"), "python": find("python3.11-doc_*.deb"), "perl": find("perl-doc_*.deb"),
              "whisper": find("openai[-_]whisper-*.tar.gz")}
    missing = [k for k, v in inputs.items() if not v]
    if missing:
        raise SystemExit(f"missing in {a.packages}: {missing} (see the fetch commands in this script's help)")
    write_gpt2_files(read_tiktoken_ranks(inputs["whisper"]), a.out)
    work = os.path.join(a.out, "unpacked")
    for name in ("linux", "python", "perl"):
        unpack(inputs[name], os.path.join(work, name))
    count = size = 0
    with open(os.path.join(a.out, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for path, text in documents(work):
            f.write(json.dumps({"text": text, "source": os.path.relpath(path, work)}) + "\n")
            count += 1
            size += len(text)
    print(f"corpus: {count} documents, {size / 1e6:.1f} M characters")
    if not a.preprocess:
        return
    vocab, merges = os.path.join(a.out, "gpt2-vocab.json"), os.path.join(a.out, "gpt2-merges.txt")
    tok = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges]
    probe = os.path.join(a.out, "probe")
    open(probe + ".jsonl", "w").write(json.dumps({"text": "Hello world"}) + "\n")
    subprocess.run([a.preprocess, "--input", probe + ".jsonl", "--output-prefix", probe] + tok, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    idx = open(probe + "_text_document.bin", "rb").read()
    ids = [int.from_bytes(idx[i:i + 2], "little") for i in range(0, len(idx), 2)]
    if ids != [15496, 995]:
        raise SystemExit(f"the converted GPT-2 files encode 'Hello world' as {ids}, not GPT-2's [15496, 995]")
    subprocess.run([a.preprocess, "--input", os.path.join(a.out, "corpus.jsonl"), "--output-prefix",
                    os.path.join(a.out, "docs")] + tok + ["--append-eod", "--workers", str(a.workers)], check=True)


if __name__ == "__main__":
    main()
