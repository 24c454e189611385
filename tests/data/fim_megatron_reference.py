#!/usr/bin/env python3
"""Runs Megatron-LM's own fill-in-the-middle code on hand-made samples and writes the results as the
golden table of tests/data/test_fim.cpp (fim_megatron_golden.inc).

Megatron's GPTFIMDataset (megatron/training/datasets/fim_dataset.py) is loaded from a Megatron-LM
checkout with its three imports stubbed (it needs neither torch nor a built dataset), given a small
word tokenizer that test_fim.cpp defines identically, and asked for sample 0 of a one-sample
dataset holding each case's tokens. Its random generator is numpy.random.RandomState([seed, index]),
the per-sample generator fp8tron uses in place of Megatron's one generator per dataset.

usage: fim_megatron_reference.py MEGATRON_DIR_OR_BARE_GIT [--check GOLDEN_INC]
  (a bare git directory is read at HEAD); --check exits 1 when the table differs, 77 when no
  Megatron source is given.
"""
import dataclasses
import os
import subprocess
import sys
import types

import numpy as np

# The test tokenizer: ids 0-25 are 'a'-'z', then ' ', 'ab', 'cd', '|', 'é'; ids 31-35 are the
# special tokens. Text is tokenized by greedy longest match over the non-special entries.
VOCAB = [chr(ord('a') + i) for i in range(26)] + [' ', 'ab', 'cd', '|', 'é', '<pre>', '<mid>', '<suf>', '<pad>', '<eod>']
SPECIAL = set(range(31, 36))


class WordTokenizer:
    def text_to_ids(self, text):
        ids, i = [], 0
        words = sorted(((w, k) for k, w in enumerate(VOCAB) if k not in SPECIAL), key=lambda x: -len(x[0]))
        while i < len(text):
            for w, k in words:
                if text.startswith(w, i):
                    ids.append(k)
                    i += len(w)
                    break
            else:
                raise ValueError(f"no token for {text[i:]!r}")
        return ids

    def ids_to_text(self, ids, remove_special_tokens=None):
        return ''.join(VOCAB[i] for i in ids if not (remove_special_tokens and i in SPECIAL))

    def tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return VOCAB.index(tokens)
        return [VOCAB.index(t) for t in tokens]


def megatron_source(where):
    path = os.path.join(where, 'megatron/training/datasets/fim_dataset.py')
    if os.path.exists(path):
        return open(path).read()
    return subprocess.run(['git', '-C', where, 'show', 'HEAD:megatron/training/datasets/fim_dataset.py'],
                          check=True, capture_output=True, text=True).stdout


def load_fim_module(source):
    @dataclasses.dataclass
    class GPTDatasetConfig:
        random_seed: int = 1234
        tokenizer: object = None

    stubs = {
        'megatron': {}, 'megatron.core': {}, 'megatron.core.datasets': {},
        'megatron.core.datasets.gpt_dataset': {'GPTDataset': type('GPTDataset', (), {}),
                                               'GPTDatasetConfig': GPTDatasetConfig},
        'megatron.core.datasets.indexed_dataset': {'IndexedDataset': object},
        'megatron.core.datasets.utils': {'Split': object},
    }
    for name, attrs in stubs.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        sys.modules[name] = module
    module = types.ModuleType('fim_dataset')
    exec(compile(source, 'fim_dataset.py', 'exec'), module.__dict__)
    return module


class OneSample:
    def __init__(self, tokens):
        self.tokens = np.array(tokens, dtype=np.int64)

    def get(self, document, offset=0, length=None):
        return self.tokens[offset:None if length is None else offset + length]


def megatron_sample(fim, case):
    tokenizer = types.SimpleNamespace(_tokenizer=WordTokenizer())
    config = fim.GPTFIMDatasetConfig(
        random_seed=case['seed'], tokenizer=tokenizer, fim_rate=case['rate'], fim_spm_rate=case['spm_rate'],
        fim_extra_tokens={'prefix': '<pre>', 'middle': '<mid>', 'suffix': '<suf>', 'pad': '<pad>', 'eod': '<eod>'},
        fim_split_sample=case.get('split'), fim_fragment_rate=case.get('fragment_rate'),
        fim_no_prefix=case.get('no_prefix'))
    ds = fim.GPTFIMDataset.__new__(fim.GPTFIMDataset)
    ds.config = config
    init_source_state(fim, ds, config)  # its rates and token ids
    ds.np_rng = np.random.RandomState([case['seed'], case['index']])  # fp8tron's per-sample generator
    tokens = case['tokens']
    ds.dataset = OneSample(tokens)
    ds.shuffle_index = np.array([0])
    ds.sample_index = np.array([[0, 0], [0, len(tokens) - 1]])
    ds.document_index = np.array([0])
    return [int(t) for t in ds._query_document_sample_shuffle_indices(0)[0]]


def init_source_state(fim, ds, config):
    """Runs GPTFIMDataset.__init__ with GPTDataset.__init__ (the index building) skipped."""
    base = fim.GPTDataset
    base.__init__ = lambda self, *args, **kwargs: setattr(self, 'config', args[-1])
    fim.GPTFIMDataset.__init__(ds, None, '', None, 1, None, config)


def text(s):
    return WordTokenizer().text_to_ids(s)


P, M, S, PAD, E = 31, 32, 33, 34, 35
CASES = []
for spm in (0.0, 1.0):  # the hand-made example of test_fim.cpp: cut after 5 and 8 characters
    CASES.append(dict(name=f'hand-made, spm rate {spm}', tokens=[0, 1, 2, 3] * 3, rate=1.0, spm_rate=spm,
                      seed=1234, index=24))
CASES.append(dict(name='whole sample, rate 1', tokens=text('abcdefgh'), rate=1.0, spm_rate=0.5, seed=1234, index=5))
CASES.append(dict(name='rate 0 leaves the sample', tokens=text('abcdef') + [E] + text('ghij'), rate=0.0,
                  spm_rate=0.5, seed=1234, index=3))
CASES.append(dict(name='rate 0 still drops empty segments', tokens=[E] + text('abc') + [E, E] + text('de'), rate=0.0,
                  spm_rate=0.5, seed=1234, index=0))
CASES.append(dict(name='segments between eod, empty ones', tokens=[E] + text('abc') + [E, E] + text('defg') + [E],
                  rate=1.0, spm_rate=0.5, seed=7, index=1))
CASES.append(dict(name='re-tokenized longer: cut to length', tokens=[27, 27, 27, 28, 28, 28], rate=1.0, spm_rate=0.0,
                  seed=1234, index=5))
CASES.append(dict(name='re-tokenized shorter: padded', tokens=[0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3],
                  rate=1.0, spm_rate=1.0, seed=99, index=2))
CASES.append(dict(name='multi-byte characters', tokens=text('éaébécé') + [E] + text('éé'), rate=1.0, spm_rate=0.5,
                  seed=3, index=4))
CASES.append(dict(name='split sample, fragment rate 1', tokens=text('abc|defg|hi') + [E] + text('jk|lm'), rate=1.0,
                  spm_rate=0.5, split='|', fragment_rate=1.0, seed=1234, index=6))
CASES.append(dict(name='split sample, fragment rate 0.5', tokens=text('ab|cdef||gh|') + [E] + text('ijk'), rate=1.0,
                  spm_rate=0.5, split='|', fragment_rate=0.5, seed=11, index=8))
CASES.append(dict(name='split sample, no split token in a segment', tokens=text('abcdef') + [E] + text('gh|ij'),
                  rate=1.0, spm_rate=0.0, split='|', fragment_rate=1.0, seed=5, index=0))
CASES.append(dict(name='no prefix', tokens=text('abcdef') + [E] + text('xyzabc') + [E] + text('abq'), rate=1.0,
                  spm_rate=0.5, no_prefix='ab', seed=1234, index=9))
for index in range(12):  # rates in between: the draws decide
    CASES.append(dict(name=f'rates 0.5, index {index}', tokens=text('the cat sat') + [E] + text('on a mat ab cd') + [E] +
                      text('é ab'), rate=0.5, spm_rate=0.5, seed=1234, index=index))


def cpp_list(values):
    return '{' + ', '.join(str(v) for v in values) + '}'


def cpp_string(value):
    return 'std::nullopt' if value is None else '"' + value + '"'


def golden(fim):
    lines = ['// Generated by tests/data/fim_megatron_reference.py from Megatron-LM\'s fim_dataset.py; do not edit.',
             '// {name, tokens, rate, spm_rate, split token, fragment rate, no prefix, seed, index, Megatron\'s sample}']
    for case in CASES:
        expected = megatron_sample(fim, case)
        split = case.get('split')
        lines.append('{"%s", %s, %r, %r, %s, %s, %s, %d, %d, %s},' % (
            case['name'], cpp_list(case['tokens']), case['rate'], case['spm_rate'],
            'std::nullopt' if split is None else str(VOCAB.index(split)),
            'std::nullopt' if case.get('fragment_rate') is None else repr(case['fragment_rate']),
            cpp_string(case.get('no_prefix')), case['seed'], case['index'], cpp_list(expected)))
    return '\n'.join(lines) + '\n'


def main():
    args = sys.argv[1:]
    check = None
    if '--check' in args:
        check = args[args.index('--check') + 1]
        del args[args.index('--check'):args.index('--check') + 2]
    where = args[0] if args else os.environ.get('MEGATRON_LM_DIR', '')
    if not where or not os.path.exists(where):
        print('no Megatron-LM source given (argument or MEGATRON_LM_DIR): skipped')
        return 77
    table = golden(load_fim_module(megatron_source(where)))
    if check is None:
        sys.stdout.write(table)
        return 0
    if open(check).read() != table:
        print(f'{check} differs from what Megatron-LM computes: regenerate it with this script')
        return 1
    print(f'{len(CASES)} samples agree with Megatron-LM')
    return 0


if __name__ == '__main__':
    sys.exit(main())
