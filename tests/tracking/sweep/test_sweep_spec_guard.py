"""Guard for the grid-spec parser (tracking/sweep/spec.py ``parse_spec``): every outcome of a
broad set of specs, recorded on the parser before it was split into helpers, so that the
split changes nothing a user sees: the same cells (options in the same order, same ids and
dependencies), the same scalars and lines, and for a broken spec the same one error
(``SpecError``, same ``file:line``, same words) chosen among several in the same order.

Option and entry-point lists in messages are written as ``<options of semi>`` and
``<entry points>`` and expanded from the click commands, so a new option of an entry point
does not break this guard while the message's wording and order still must not change.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from scarcelab.entrypoints.cli import main
from scarcelab.tracking.sweep.spec import RESERVED, SpecError, entry_options, parse_spec

FULL_OPTIONS = """\
name: '  spaced  '
experiment: ' ex '
description: anything
cpus_per_cell: 2.5
gpus_per_cell: 1
retries: 3
env: {OMP_NUM_THREADS: 1, SCARCELAB_USER_FLAG: true, SCARCELAB_USER_RATE: 0.5, PYTHONHASHSEED: 0}
grids:
  - entry: semi
    method: [fixmatch, pseudolabel]
    budget-minutes: 2
    set: {lambda_u: 1, threshold: 0.9}
    seed: [0, 1]
    full: {budget_minutes: 9, max_epochs: 3}
  - entry: al
    strategy: [random]
    dataset: splice
    query_size: [1, 5]
    smoke: {query_size: 1, experiment: nope}
full:
  budget_minutes: 60
smoke:
  experiment: ' ci '
  seed: 0
"""

SCALES = """\
name: s
experiment: e
grids:
  - entry: semi
    method: [fixmatch, pseudolabel]
    seed: [0, 1]
    budget_minutes: 2
    full: {budget_minutes: 9, max_epochs: 3}
    smoke: {max_epochs: 1}
  - entry: al
    strategy: [random]
    dataset: splice
    query_size: [1, 5]
    smoke: {query_size: 1}
full:
  dataset: d
smoke:
  experiment: ' ci '
  dataset: s
"""

DEPS_TWO_REFS = """\
name: d
grids:
  - {id: pre, entry: self, method: simclr, seed: [0, 1], dataset: [a, b]}
  - {id: pre2, entry: self, method: [byol], seed: [0, 1]}
  - entry: probe
    encoder: ["@pre", random]
    arch: "@pre2"
    seed: [0, 1]
    dataset: [a, b]
"""

#: (case, spec text, parse_spec keywords, outcome recorded on the code before the split)
CASES: list[tuple[str, str, dict[str, Any], str | dict[str, Any]]] = [
    ('full-options', FULL_OPTIONS, {},
     {'name': 'spaced',
      'experiment': 'ex',
      'scale': 'reference',
      'cpus_per_cell': 2.5,
      'gpus_per_cell': 1.0,
      'retries': 3,
      'env': {'OMP_NUM_THREADS': '1',
              'SCARCELAB_USER_FLAG': 'True',
              'SCARCELAB_USER_RATE': '0.5',
              'PYTHONHASHSEED': '0'},
      'lines': {'name': 1,
                'experiment': 2,
                'description': 3,
                'cpus_per_cell': 4,
                'gpus_per_cell': 5,
                'retries': 6,
                'env': 7,
                'grids': 8,
                'full': 20,
                'smoke': 22},
      'path': 'g.yaml',
      'cells': [(0, '34072653d56c9f20',
                 'semi --method fixmatch --budget-minutes 2 --set '
                 'lambda_u=1,threshold=0.9 --seed 0',
                 ()),
                (0, '58f8d037ae2bbb4d',
                 'semi --method fixmatch --budget-minutes 2 --set '
                 'lambda_u=1,threshold=0.9 --seed 1',
                 ()),
                (0, 'e3df2e8b534b6b2c',
                 'semi --method pseudolabel --budget-minutes 2 --set '
                 'lambda_u=1,threshold=0.9 --seed 0',
                 ()),
                (0, 'ccc9dd8c201bd17b',
                 'semi --method pseudolabel --budget-minutes 2 --set '
                 'lambda_u=1,threshold=0.9 --seed 1',
                 ()),
                (1, 'cf875cab52382dab',
                 'al --strategy random --dataset splice --query-size 1', ()),
                (1, '74bd1159273732f9',
                 'al --strategy random --dataset splice --query-size 5', ())]}),
    ('full-options@full-same-option', FULL_OPTIONS, {'full': True},
     ("g.yaml:14: 'budget_minutes' and 'budget-minutes' are the same option "
      '--budget-minutes; keep one')),
    ('full-options@smoke-unknown-option', FULL_OPTIONS, {'smoke': True},
     "g.yaml:24: al has no option 'seed'; valid: <options of al>"),
    ('scales', SCALES, {},
     {'name': 's',
      'experiment': 'e',
      'scale': 'reference',
      'cpus_per_cell': 1.0,
      'gpus_per_cell': 'auto',
      'retries': 1,
      'env': {},
      'lines': {'name': 1, 'experiment': 2, 'grids': 3, 'full': 15, 'smoke': 17},
      'path': 'g.yaml',
      'cells': [(0, '53f88d8935a4b3d8',
                 'semi --method fixmatch --seed 0 --budget-minutes 2', ()),
                (0, '29d2819321e69be8',
                 'semi --method fixmatch --seed 1 --budget-minutes 2', ()),
                (0, '68ca18c0e18d89a5',
                 'semi --method pseudolabel --seed 0 --budget-minutes 2', ()),
                (0, '646b60474ee18cbb',
                 'semi --method pseudolabel --seed 1 --budget-minutes 2', ()),
                (1, 'cf875cab52382dab',
                 'al --strategy random --dataset splice --query-size 1', ()),
                (1, '74bd1159273732f9',
                 'al --strategy random --dataset splice --query-size 5', ())]}),
    ('scales@full', SCALES, {'full': True},
     {'name': 's',
      'experiment': 'e',
      'scale': 'full',
      'cpus_per_cell': 1.0,
      'gpus_per_cell': 'auto',
      'retries': 1,
      'env': {},
      'lines': {'name': 1, 'experiment': 2, 'grids': 3, 'full': 15, 'smoke': 17},
      'path': 'g.yaml',
      'cells': [(0, '9581d49bd7525e0a',
                 'semi --method fixmatch --seed 0 --budget-minutes 9 --dataset d '
                 '--max-epochs 3',
                 ()),
                (0, '454b86410225ef75',
                 'semi --method fixmatch --seed 1 --budget-minutes 9 --dataset d '
                 '--max-epochs 3',
                 ()),
                (0, '19ecc2b7d12cdffb',
                 'semi --method pseudolabel --seed 0 --budget-minutes 9 --dataset d '
                 '--max-epochs 3',
                 ()),
                (0, '0ffa14005208121c',
                 'semi --method pseudolabel --seed 1 --budget-minutes 9 --dataset d '
                 '--max-epochs 3',
                 ()),
                (1, '0f3c86497366116f', 'al --strategy random --dataset d --query-size 1',
                 ()),
                (1, '0250fbcf6ff29bb7', 'al --strategy random --dataset d --query-size 5',
                 ())]}),
    ('scales@smoke', SCALES, {'smoke': True},
     {'name': 's',
      'experiment': 'ci',
      'scale': 'smoke',
      'cpus_per_cell': 1.0,
      'gpus_per_cell': 'auto',
      'retries': 1,
      'env': {},
      'lines': {'name': 1, 'experiment': 2, 'grids': 3, 'full': 15, 'smoke': 17},
      'path': 'g.yaml',
      'cells': [(0, 'f1e0be4246f16587',
                 'semi --method fixmatch --seed 0 --budget-minutes 2 --dataset s '
                 '--max-epochs 1',
                 ()),
                (0, 'd07c8355a641ff7d',
                 'semi --method fixmatch --seed 1 --budget-minutes 2 --dataset s '
                 '--max-epochs 1',
                 ()),
                (0, '58bd3cbe8b259b37',
                 'semi --method pseudolabel --seed 0 --budget-minutes 2 --dataset s '
                 '--max-epochs 1',
                 ()),
                (0, 'c172e938afaa54d3',
                 'semi --method pseudolabel --seed 1 --budget-minutes 2 --dataset s '
                 '--max-epochs 1',
                 ()),
                (1, 'a43b75efb6e16be5', 'al --strategy random --dataset s --query-size 1',
                 ())]}),
    ('dup-axis-value', 'name: n\ngrids:\n  - {entry: semi, method: [a, a]}\n', {},
     ("g.yaml:3: cell 'semi method=a' appears twice (grids 0 and 0): a sweep runs each "
      'cell once')),
    ('smoke-default-exp',
     ('name: n\n'
      'grids:\n'
      '  - {entry: semi, method: [a, b], seed: 0}\n'
      'smoke: {seed: 1, budget_minutes: 1}\n'),
     {'smoke': True},
     {'name': 'n',
      'experiment': 'n-smoke',
      'scale': 'smoke',
      'cpus_per_cell': 1.0,
      'gpus_per_cell': 'auto',
      'retries': 1,
      'env': {},
      'lines': {'name': 1, 'grids': 2, 'smoke': 4},
      'path': 'g.yaml',
      'cells': [(0, 'da7d54de7723b9dc', 'semi --method a --seed 1 --budget-minutes 1', ()),
                (0, '876c7705ba5b1daa', 'semi --method b --seed 1 --budget-minutes 1',
                 ())]}),
    ('smoke-empty-block',
     ('name: n\n'
      'grids:\n'
      '  - {entry: semi, method: a, smoke: }\n'
      'smoke:\n'
      'full: {}\n'),
     {'smoke': True},
     {'name': 'n',
      'experiment': 'n-smoke',
      'scale': 'smoke',
      'cpus_per_cell': 1.0,
      'gpus_per_cell': 'auto',
      'retries': 1,
      'env': {},
      'lines': {'name': 1, 'grids': 2, 'smoke': 4, 'full': 5},
      'path': 'g.yaml',
      'cells': [(0, '5791e8c071fdbfae', 'semi --method a', ())]}),
    ('gpus-auto-retries0',
     ('name: n\n'
      'gpus_per_cell: auto\n'
      'retries: 0\n'
      'cpus_per_cell: 0.01\n'
      'grids:\n'
      '  - {entry: semi, method: a}\n'),
     {},
     {'name': 'n',
      'experiment': 'n',
      'scale': 'reference',
      'cpus_per_cell': 0.01,
      'gpus_per_cell': 'auto',
      'retries': 0,
      'env': {},
      'lines': {'name': 1,
                'gpus_per_cell': 2,
                'retries': 3,
                'cpus_per_cell': 4,
                'grids': 5},
      'path': 'g.yaml',
      'cells': [(0, '5791e8c071fdbfae', 'semi --method a', ())]}),
    ('gpus-zero-int-values',
     ('name: n\n'
      'gpus_per_cell: 0\n'
      'grids:\n'
      '  - {entry: semi, method: [true, 1.5, 2], seed: [null_not, 3]}\n'),
     {},
     {'name': 'n',
      'experiment': 'n',
      'scale': 'reference',
      'cpus_per_cell': 1.0,
      'gpus_per_cell': 0.0,
      'retries': 1,
      'env': {},
      'lines': {'name': 1, 'gpus_per_cell': 2, 'grids': 3},
      'path': 'g.yaml',
      'cells': [(0, '775fe4276801be3c', 'semi --method true --seed null_not', ()),
                (0, '8e529658b540112b', 'semi --method true --seed 3', ()),
                (0, '5659fc723a37759e', 'semi --method 1.5 --seed null_not', ()),
                (0, '42fbf67ab606d2ca', 'semi --method 1.5 --seed 3', ()),
                (0, '63fa890500af0ef1', 'semi --method 2 --seed null_not', ()),
                (0, '60df41ccf82cc53e', 'semi --method 2 --seed 3', ())]}),
    ('bool-mapping-values',
     ('name: n\n'
      'grids:\n'
      '  - entry: semi\n'
      '    set: [{a: true, b: {c: 1}}, {a: false}]\n'
      '    method: sup\n'),
     {},
     {'name': 'n',
      'experiment': 'n',
      'scale': 'reference',
      'cpus_per_cell': 1.0,
      'gpus_per_cell': 'auto',
      'retries': 1,
      'env': {},
      'lines': {'name': 1, 'grids': 2},
      'path': 'g.yaml',
      'cells': [(0, '0324b13fa3f2154d', 'semi --set a=true,b=c=1 --method sup', ()),
                (0, '5b0b839d68b5038d', 'semi --set a=false --method sup', ())]}),
    ('deps-two-refs', DEPS_TWO_REFS, {},
     {'name': 'd',
      'experiment': 'd',
      'scale': 'reference',
      'cpus_per_cell': 1.0,
      'gpus_per_cell': 'auto',
      'retries': 1,
      'env': {},
      'lines': {'name': 1, 'grids': 2},
      'path': 'g.yaml',
      'cells': [(0, '2e683ee06cdb8a12', 'self --method simclr --seed 0 --dataset a', ()),
                (0, 'd0aaa11ad12b94db', 'self --method simclr --seed 0 --dataset b', ()),
                (0, '32bfb286b1b530d3', 'self --method simclr --seed 1 --dataset a', ()),
                (0, '30726fb83d680f19', 'self --method simclr --seed 1 --dataset b', ()),
                (1, '802e6fa4dad6e866', 'self --method byol --seed 0', ()),
                (1, 'a9bd2097d8b4bbb6', 'self --method byol --seed 1', ()),
                (2, 'ead53d96eddb4b8c',
                 'probe --encoder @pre --arch @pre2 --seed 0 --dataset a',
                 (('encoder', 0), ('arch', 4))),
                (2, 'cf6ffe274c3fe513',
                 'probe --encoder @pre --arch @pre2 --seed 0 --dataset b',
                 (('encoder', 1), ('arch', 4))),
                (2, '409d1a5afcdb54ea',
                 'probe --encoder @pre --arch @pre2 --seed 1 --dataset a',
                 (('encoder', 2), ('arch', 5))),
                (2, 'a04504df67a99f9f',
                 'probe --encoder @pre --arch @pre2 --seed 1 --dataset b',
                 (('encoder', 3), ('arch', 5))),
                (2, 'b538f19aec71daea',
                 'probe --encoder random --arch @pre2 --seed 0 --dataset a',
                 (('arch', 4),)),
                (2, '529db54c34b12df7',
                 'probe --encoder random --arch @pre2 --seed 0 --dataset b',
                 (('arch', 4),)),
                (2, '62d0a186337b5341',
                 'probe --encoder random --arch @pre2 --seed 1 --dataset a',
                 (('arch', 5),)),
                (2, 'b0bec42e62953381',
                 'probe --encoder random --arch @pre2 --seed 1 --dataset b',
                 (('arch', 5),))]}),
    ('deps-ref-order',
     ('name: d\n'
      'grids:\n'
      '  - {entry: probe, encoder: "@late", seed: [0, 1]}\n'
      '  - {id: late, entry: self, method: simclr, seed: [0, 1]}\n'),
     {},
     {'name': 'd',
      'experiment': 'd',
      'scale': 'reference',
      'cpus_per_cell': 1.0,
      'gpus_per_cell': 'auto',
      'retries': 1,
      'env': {},
      'lines': {'name': 1, 'grids': 2},
      'path': 'g.yaml',
      'cells': [(0, '6153e06f341be73f', 'probe --encoder @late --seed 0',
                 (('encoder', 2),)),
                (0, 'e4839398e7a2a615', 'probe --encoder @late --seed 1',
                 (('encoder', 3),)),
                (1, 'de45e1a1b75ee101', 'self --method simclr --seed 0', ()),
                (1, 'dffc975e2b6aee53', 'self --method simclr --seed 1', ())]}),
    ('dup-ref-same-grid',
     ('name: d\n'
      'grids:\n'
      '  - {id: p, entry: self, method: simclr}\n'
      "  - {entry: probe, encoder: ['@p', '@p'], seed: 0}\n"),
     {},
     ("g.yaml:4: cell 'probe encoder=@p seed=0' appears twice (grids 1 and 1): a sweep "
      'runs each cell once')),
    ('merge-key',
     ('name: m\n'
      'grids:\n'
      '  - &c {entry: semi, method: [a, b]}\n'
      '  - <<: *c\n'
      '    method: c\n'),
     {},
     {'name': 'm',
      'experiment': 'm',
      'scale': 'reference',
      'cpus_per_cell': 1.0,
      'gpus_per_cell': 'auto',
      'retries': 1,
      'env': {},
      'lines': {'name': 1, 'grids': 2},
      'path': 'g.yaml',
      'cells': [(0, '5791e8c071fdbfae', 'semi --method a', ()),
                (0, '6eee822389d6fc63', 'semi --method b', ()),
                (1, 'bd86998dcc0926e4', 'semi --method c', ())]}),
    ('cap-exact',
     ('name: c\n'
      'grids:\n'
      '  - {entry: semi, method: [a, b], seed: [0, 1, 2]}\n'),
     {'max_cells': 6},
     {'name': 'c',
      'experiment': 'c',
      'scale': 'reference',
      'cpus_per_cell': 1.0,
      'gpus_per_cell': 'auto',
      'retries': 1,
      'env': {},
      'lines': {'name': 1, 'grids': 2},
      'path': 'g.yaml',
      'cells': [(0, '41944036b669419a', 'semi --method a --seed 0', ()),
                (0, '725cf4d207a8d519', 'semi --method a --seed 1', ()),
                (0, '56ea056dd2261077', 'semi --method a --seed 2', ()),
                (0, 'd1cabe428ab76f89', 'semi --method b --seed 0', ()),
                (0, '77e5f498baaaff3b', 'semi --method b --seed 1', ()),
                (0, 'b3fc30270b9cb8d7', 'semi --method b --seed 2', ())]}),
    ('both-scales', 'not: [valid', {'full': True, 'smoke': True},
     'g.yaml: --full and --smoke are 2 scales; choose one'),
    ('yaml-bad', 'name: x\ngrids: [\n', {},
     "g.yaml:3: not valid YAML: expected the node content, but found '<stream end>'"),
    ('yaml-at', 'name: x\ngrids:\n  - {entry: semi, encoder: @p}\n', {},
     ("g.yaml:3: not valid YAML: found character '@' that cannot start any token (quote a "
      'reference to another grid: "@pretrain")')),
    ('yaml-control', 'name: x\x07\n', {},
     ("g.yaml:1: not valid YAML: character '\\x07' is not allowed in YAML (special "
      'characters are not allowed); remove it')),
    ('deep', "name: x\ngrids: " + "[" * 3000 + "]" * 3000 + "\n", {},
     'g.yaml:0: the spec nests values too deeply to read; flatten it'),
    ('empty', '', {},
     "g.yaml:0: a spec is a mapping with at least 'name' and 'grids'"),
    ('comment-only', '# nothing\n', {},
     "g.yaml:0: a spec is a mapping with at least 'name' and 'grids'"),
    ('list-top', '- a\n- b\n', {},
     "g.yaml:1: a spec is a mapping with at least 'name' and 'grids'"),
    ('scalar-top', '\n\nhello\n', {},
     "g.yaml:3: a spec is a mapping with at least 'name' and 'grids'"),
    ('unknown-key-before-name', 'gridz: 1\nfoo: 2\n', {},
     ("g.yaml:1: unknown key 'gridz'; valid: claims, cpus_per_cell, description, env, experiment, "
      'full, gpu_memory_fraction, gpus_per_cell, grids, mps, name, retries, smoke')),
    ('name-missing', 'grids: []\n', {},
     "g.yaml:1: 'name' (the sweep's name) is required"),
    ('name-empty', "name: '  '\ngrids: []\n", {},
     "g.yaml:1: 'name' (the sweep's name) is required"),
    ('name-int', '\nname: 3\ngrids: []\n', {},
     "g.yaml:2: 'name' (the sweep's name) is required"),
    ('name-quote', 'name: "a\'b"\ngrids: []\n', {},
     ('g.yaml:1: the sweep name "a\'b" holds "\'": quotes, backticks, backslashes and '
      'control characters cannot be searched for in MLflow; rename it')),
    ('name-ctrl', 'name: "a\\tb"\ngrids: []\n', {},
     ("g.yaml:1: the sweep name 'a\\tb' holds '\\t': quotes, backticks, backslashes and "
      'control characters cannot be searched for in MLflow; rename it')),
    ('grids-missing', 'name: x\n', {},
     "g.yaml:1: 'grids' must be a non-empty list of grids"),
    ('grids-empty', 'name: x\ngrids: []\n', {},
     "g.yaml:2: 'grids' must be a non-empty list of grids"),
    ('grids-mapping', 'name: x\ngrids:\n  a: 1\n', {},
     "g.yaml:3: 'grids' must be a non-empty list of grids"),
    ('full-not-mapping', 'name: x\ngrids: [1]\nfull: [1]\nsmoke: 3\n', {},
     "g.yaml:3: 'full' must be a mapping of options"),
    ('smoke-not-mapping', 'name: x\ngrids: [1]\nsmoke: 3\n', {},
     "g.yaml:3: 'smoke' must be a mapping of options"),
    ('smoke-not-mapping-at-full', 'name: x\ngrids: [1]\nsmoke: 3\n', {'full': True},
     "g.yaml:3: 'smoke' must be a mapping of options"),
    ('cpus-bool', 'name: x\ngrids: [1]\ncpus_per_cell: true\n', {},
     "g.yaml:3: 'cpus_per_cell' must be a number >= 0.01, got True"),
    ('cpus-str', 'name: x\ngrids: [1]\ncpus_per_cell: one\n', {},
     "g.yaml:3: 'cpus_per_cell' must be a number >= 0.01, got 'one'"),
    ('cpus-small', 'name: x\ngrids: [1]\ncpus_per_cell: 0.001\n', {},
     "g.yaml:3: 'cpus_per_cell' must be a number >= 0.01, got 0.001"),
    ('gpus-neg', 'name: x\ngrids: [1]\ngpus_per_cell: -1\ncpus_per_cell: 0\n', {},
     "g.yaml:4: 'cpus_per_cell' must be a number >= 0.01, got 0"),
    ('gpus-str', 'name: x\ngrids: [1]\ngpus_per_cell: AUTO\n', {},
     "g.yaml:3: 'gpus_per_cell' must be a number >= 0, got 'AUTO'"),
    ('gpus-null', 'name: x\ngrids: [1]\ngpus_per_cell:\n', {},
     "g.yaml:3: 'gpus_per_cell' must be a number >= 0, got None"),
    ('retries-neg', 'name: x\ngrids: [1]\nretries: -1\n', {},
     "g.yaml:3: 'retries' must be a number >= 0, got -1"),
    ('retries-float', 'name: x\ngrids:\n  - {entry: semi, method: a}\nretries: 1.7\n', {},
     {'name': 'x',
      'experiment': 'x',
      'scale': 'reference',
      'cpus_per_cell': 1.0,
      'gpus_per_cell': 'auto',
      'retries': 1,
      'env': {},
      'lines': {'name': 1, 'grids': 2, 'retries': 4},
      'path': 'g.yaml',
      'cells': [(0, '5791e8c071fdbfae', 'semi --method a', ())]}),
    ('env-list', 'name: x\ngrids: [1]\nenv: [A]\n', {},
     "g.yaml:3: 'env' must be a mapping NAME: value"),
    ('env-null-ok', 'name: x\ngrids:\n  - {entry: semi, method: a}\nenv:\n', {},
     {'name': 'x',
      'experiment': 'x',
      'scale': 'reference',
      'cpus_per_cell': 1.0,
      'gpus_per_cell': 'auto',
      'retries': 1,
      'env': {},
      'lines': {'name': 1, 'grids': 2, 'env': 4},
      'path': 'g.yaml',
      'cells': [(0, '5791e8c071fdbfae', 'semi --method a', ())]}),
    ('env-bad-name', "name: x\ngrids: [1]\nenv:\n  OMP_NUM_THREADS: 1\n  'A-B': x\n", {},
     "g.yaml:5: env: 'A-B' is not a variable name (letters, digits and _)"),
    ('env-int-name', 'name: x\ngrids: [1]\nenv:\n  1: x\n', {},
     "g.yaml:0: env: '1' is not a variable name (letters, digits and _)"),
    ('env-driver', 'name: x\ngrids: [1]\nenv:\n  mlflow_run_id: x\n', {},
     'g.yaml:4: env: mlflow_run_id is set by the sweep driver for every cell'),
    ('env-code', 'name: x\ngrids: [1]\nenv:\n  PythonPath: x\n', {},
     ("g.yaml:4: env: PythonPath can load code into every cell; a spec's env: is data and "
      'may not set it (set it in the environment of the driver or of the Ray workers '
      'instead; docs/sweeps.md lists the refused variables)')),
    ('env-null-value', 'name: x\ngrids: [1]\nenv:\n  SCARCELAB_USER_A:\n', {},
     "g.yaml:4: env: SCARCELAB_USER_A's value must be a string, got NoneType"),
    ('env-dict-value', 'name: x\ngrids: [1]\nenv:\n  SCARCELAB_USER_A: {b: 1}\n', {},
     "g.yaml:4: env: SCARCELAB_USER_A's value must be a string, got dict"),
    ('env-nul-value', 'name: x\ngrids: [1]\nenv:\n  SCARCELAB_USER_A: "a\\0b"\n', {},
     "g.yaml:4: env: SCARCELAB_USER_A's value must be a string, got str"),
    ('grid-not-mapping', 'name: x\ngrids:\n  - {entry: semi, method: a}\n  - 3\n', {},
     "g.yaml:4: each grid is a mapping with an 'entry' (e.g. entry: semi)"),
    ('grid-no-entry', 'name: x\ngrids:\n  - {method: a}\n', {},
     "g.yaml:3: each grid is a mapping with an 'entry' (e.g. entry: semi)"),
    ('grid-unknown-entry', 'name: x\ngrids:\n  - {entry: 5}\n', {},
     "g.yaml:3: unknown entry point '5'; valid: <entry points>"),
    ('grid-id-empty', "name: x\ngrids:\n  - {entry: semi, id: ' '}\n", {},
     "g.yaml:3: a grid's 'id' is a name (e.g. id: pretrain), got ' '"),
    ('grid-id-ref', "name: x\ngrids:\n  - {entry: semi, id: '@a'}\n", {},
     "g.yaml:3: a grid's 'id' is a name (e.g. id: pretrain), got '@a'"),
    ('grid-id-null', 'name: x\ngrids:\n  - entry: semi\n    id:\n', {},
     "g.yaml:4: a grid's 'id' is a name (e.g. id: pretrain), got None"),
    ('grid-id-twice',
     ('name: x\n'
      'grids:\n'
      '  - {entry: semi, id: a, method: x}\n'
      '  - {entry: semi, id: a, method: y}\n'),
     {},
     "g.yaml:4: grid id 'a' is used twice (first at line 3)"),
    ('grid-full-bad', 'name: x\ngrids:\n  - entry: semi\n    smoke: {a: 1}\n    full: 3\n', {},
     "g.yaml:5: a grid's 'full' must be a mapping of its options"),
    ('grid-smoke-bad', 'name: x\ngrids:\n  - entry: semi\n    smoke: [1]\n', {},
     "g.yaml:4: a grid's 'smoke' must be a mapping of its options"),
    ('same-option-over-grid',
     ('name: x\n'
      'grids:\n'
      '  - entry: semi\n'
      '    budget_minutes: 1\n'
      'full:\n'
      '  budget-minutes: 2\n'),
     {'full': True},
     ("g.yaml:6: 'budget-minutes' and 'budget_minutes' are the same option "
      '--budget-minutes; keep one')),
    ('same-option-own-over',
     ('name: x\n'
      'grids:\n'
      '  - entry: semi\n'
      '    full: {budget-minutes: 3}\n'
      'full:\n'
      '  budget_minutes: 2\n'),
     {'full': True},
     ("g.yaml:4: 'budget-minutes' and 'budget_minutes' are the same option "
      '--budget-minutes; keep one')),
    ('own-overrides-over-line',
     ('name: x\n'
      'grids:\n'
      '  - entry: semi\n'
      '    full:\n'
      '      methd: 3\n'
      'full:\n'
      '  methd: 2\n'),
     {'full': True},
     "g.yaml:5: semi has no option 'methd'; valid: <options of semi>"),
    ('over-line',
     ('name: x\n'
      'grids:\n'
      '  - entry: semi\n'
      '    methd: 1\n'
      'full:\n'
      '  methd: 2\n'),
     {'full': True},
     "g.yaml:6: semi has no option 'methd'; valid: <options of semi>"),
    ('over-line-ref-scale',
     ('name: x\n'
      'grids:\n'
      '  - entry: semi\n'
      '    methd: 1\n'
      'full:\n'
      '  methd: 2\n'),
     {},
     "g.yaml:4: semi has no option 'methd'; valid: <options of semi>"),
    ('reserved-own-smoke',
     ('name: x\n'
      'grids:\n'
      '  - entry: semi\n'
      '    smoke: {experiment: e}\n'),
     {'smoke': True},
     ("g.yaml:4: 'experiment' is set by the sweep (the spec's top-level 'experiment'), "
      'not per grid')),
    ('reserved-dash', 'name: x\ngrids:\n  - {entry: semi, experiment: e}\n', {},
     ("g.yaml:3: 'experiment' is set by the sweep (the spec's top-level 'experiment'), "
      'not per grid')),
    ('unknown-option', 'name: x\ngrids:\n  - {entry: al, strat: a}\n', {},
     "g.yaml:3: al has no option 'strat'; valid: <options of al>"),
    ('int-key', 'name: x\ngrids:\n  - entry: semi\n    1: a\n', {},
     'g.yaml:0: semi has no option 1; valid: <options of semi>'),
    ('empty-list-over', 'name: x\ngrids:\n  - entry: semi\nsmoke:\n  seed: []\n', {'smoke': True},
     "g.yaml:5: 'seed' is an empty list: the grid would be empty"),
    ('value-null', 'name: x\ngrids:\n  - entry: semi\n    seed:\n', {},
     "g.yaml:4: 'seed': each value must be a scalar or a mapping, got None"),
    ('value-nested-list', 'name: x\ngrids:\n  - entry: semi\n    seed: [1, [2]]\n', {},
     "g.yaml:4: 'seed': each value must be a scalar or a mapping, got [2]"),
    ('two-refs',
     ('name: x\n'
      'grids:\n'
      '  - {id: a, entry: self, method: s}\n'
      '  - {id: b, entry: self, method: t}\n'
      '  - entry: probe\n'
      "    encoder: ['@a', '@b']\n"),
     {},
     "g.yaml:6: 'encoder' refers to two grids (@a, @b); one reference per option"),
    ('cap-one-dims',
     ('name: x\n'
      'grids:\n'
      '  - {entry: semi, method: a}\n'
      '  - {entry: semi, method: b}\n'),
     {'max_cells': 1},
     ('g.yaml:4: this grid has 1 cells (one), 2 with the grids before it: more than the '
      'cap of 1; shrink its axes, split the sweep, or raise the cap with --max-cells')),
    ('cap-zero', 'name: x\ngrids:\n  - {entry: semi, method: [a, a]}\n', {'max_cells': 0},
     ('g.yaml:3: this grid has 2 cells (2 method): more than the cap of 0; shrink its '
      'axes, split the sweep, or raise the cap with --max-cells')),
    ('cap-before-later-errors',
     ('name: x\n'
      'grids:\n'
      '  - {entry: semi, method: [a, b, c]}\n'
      '  - {entry: semi, methd: b}\n'),
     {'max_cells': 2},
     ('g.yaml:3: this grid has 3 cells (3 method): more than the cap of 2; shrink its '
      'axes, split the sweep, or raise the cap with --max-cells')),
    ('option-error-before-ref-error',
     ('name: x\n'
      'grids:\n'
      "  - {entry: probe, encoder: '@nope'}\n"
      '  - {entry: semi, methd: b}\n'),
     {},
     "g.yaml:4: semi has no option 'methd'; valid: <options of semi>"),
    ('ref-unknown-no-ids', "name: x\ngrids:\n  - {entry: probe, encoder: '@nope'}\n", {},
     ("g.yaml:3: encoder: @nope names no grid (grid ids: none: give the grid an 'id: "
      "<name>')")),
    ('ref-unknown-ids',
     ('name: x\n'
      'grids:\n'
      '  - {id: z, entry: self, method: s}\n'
      '  - {id: a, entry: self, method: t}\n'
      "  - {entry: probe, encoder: '@nope'}\n"),
     {},
     'g.yaml:5: encoder: @nope names no grid (grid ids: a, z)'),
    ('ref-cycle-3',
     ('name: x\n'
      'grids:\n'
      "  - {id: a, entry: probe, encoder: '@b'}\n"
      "  - {entry: probe, id: b, encoder: '@c'}\n"
      "  - {entry: probe, encoder: '@a', id: c}\n"),
     {},
     ('g.yaml:5: encoder: @a makes a dependency cycle (grid 0 (a) -> grid 1 (b) -> grid 2 '
      '(c) -> grid 0 (a)); a grid cannot depend on itself, directly or not')),
    ('ref-cycle-2',
     ('name: x\n'
      'grids:\n'
      "  - {entry: probe, id: a, encoder: '@b'}\n"
      "  - {entry: probe, id: b, arch: '@a'}\n"),
     {},
     ('g.yaml:4: arch: @a makes a dependency cycle (grid 0 (a) -> grid 1 (b) -> grid 0 '
      '(a)); a grid cannot depend on itself, directly or not')),
    ('ref-no-match-no-axis',
     ('name: x\n'
      'grids:\n'
      '  - {id: p, entry: self, method: s, seed: [1, 2]}\n'
      "  - {entry: probe, encoder: '@p'}\n"),
     {},
     ("g.yaml:4: encoder=@p for cell 'probe encoder=@p' matches 2 cells of grid 'p' "
      '(matched on nothing (no shared axis); they differ in seed): add those keys to this '
      "grid with the same values, or split grid 'p' into grids with their own ids")),
    ('ref-no-match',
     ('name: x\n'
      'grids:\n'
      '  - {id: p, entry: self, method: s, seed: [1, 2]}\n'
      "  - {entry: probe, encoder: '@p', seed: 3}\n"),
     {},
     ("g.yaml:4: encoder=@p for cell 'probe encoder=@p seed=3': no cell of grid 'p' has "
      'seed=3; give both grids the same values on the axes they share')),
    ('ref-axis-duplicate-values',
     ('name: x\n'
      'grids:\n'
      '  - {id: p, entry: self, method: [s, s]}\n'
      "  - {entry: probe, encoder: '@p', method: x}\n"),
     {},
     ("g.yaml:4: encoder=@p for cell 'probe encoder=@p method=x' matches 2 cells of grid "
      "'p' (matched on nothing (no shared axis); they differ in ): add those keys to this "
      "grid with the same values, or split grid 'p' into grids with their own ids")),
    ('dup-cell-across',
     ('name: x\n'
      'grids:\n'
      '  - {entry: semi, method: a}\n'
      '  - {entry: semi, method: [b, a]}\n'),
     {},
     ("g.yaml:4: cell 'semi method=a' appears twice (grids 0 and 1): a sweep runs each "
      'cell once')),
    ('dup-cell-ref-before-dup',
     ('name: x\n'
      'grids:\n'
      '  - {entry: semi, method: a}\n'
      '  - {entry: semi, method: a}\n'
      "  - {entry: probe, encoder: '@q'}\n"),
     {},
     "g.yaml:5: encoder: @q names no grid (grid ids: none: give the grid an 'id: <name>')"),
]


def _expand(message: str) -> str:
    """The recorded message with its list placeholders written out as the parser lists them."""
    def options(m: re.Match[str]) -> str:
        opts = entry_options(m.group(1)) or {}
        return ", ".join(sorted(k for k in opts if k not in RESERVED))

    from scarcelab.tracking.sweep.spec import NOT_CELLS

    entries = ", ".join(sorted(n for n in main.commands if n not in NOT_CELLS))
    return re.sub(r"<options of (\S+)>", options, message).replace("<entry points>", entries)


def _outcome(text: str, kwargs: dict[str, Any]) -> str | dict[str, Any]:
    """What ``parse_spec`` gives, in the recorded form: the error's message, or the spec's
    fields with each cell as (grid, id, command line, refs as indices into the cells)."""
    try:
        sp = parse_spec(text, "g.yaml", **kwargs)
    except SpecError as e:
        assert type(e) is SpecError
        return str(e)
    assert sp.text == text
    index = {c.id: i for i, c in enumerate(sp.cells)}
    return {"name": sp.name, "experiment": sp.experiment, "scale": sp.scale,
            "cpus_per_cell": sp.cpus_per_cell, "gpus_per_cell": sp.gpus_per_cell,
            "retries": sp.retries, "env": sp.env, "lines": sp.lines, "path": sp.path,
            "cells": [(c.grid, c.id, " ".join(c.argv()),
                       tuple((k, index[r]) for k, r in c.refs)) for c in sp.cells]}


@pytest.mark.parametrize("text,kwargs,expected", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_parse_spec_outcome_is_the_recorded_one(text, kwargs, expected):
    got = _outcome(text, kwargs)
    if isinstance(expected, str):
        assert got == _expand(expected)
    else:
        assert got == expected
        # the types too: 2 == 2.0 would hide a float turned int
        assert [type(got[k]) for k in ("cpus_per_cell", "gpus_per_cell", "retries")] == \
            [type(expected[k]) for k in ("cpus_per_cell", "gpus_per_cell", "retries")]
