#!/usr/bin/env python3
"""bench/trace_step.py — what each kernel costs inside one decode step.

Reads a kernel timeline CSV ("Start (ns)","Duration (ns)","Name": the
output of bench/cupti_trace.c) of a bench-engine decode run. Steps are cut
at their first kernel: the embedding (k_embed, k_qembed), or since
docs/cuda.md v32 the embedding fused with the first RMSNorm
(k_add_rmsnorm in an embedding mode, SRC 1 or 2); step N (default: the
12th, past the graph captures) is printed kernel by kernel:

  start / end      relative to the step's first kernel start, in us
  dur              the kernel's own start -> end (with PDL this includes
                   time spent waiting for the kernel before)
  inc              end - the latest end before it: the time this kernel
                   adds to the step's critical path

then the increments and durations summed per kernel name and
predecessor (one template serves several roles: the q/k/v GEMV follows
add + RMSNorm, the output GEMV the attention) over the step.
The increments add up to the step time; that is the accounting the
docs/cuda.md decode tables want, measured inside the replayed graph.

Usage: trace_step.py TRACE.csv [STEP] [--all]
"""
import collections
import csv
import re
import sys


def short(name):
    """k_gemv<1, 4, 0, 1> out of a mangled or demangled name, best effort."""
    n = name.split('(')[0]
    if n.startswith('_Z'):
        # _Z<len><name>I...: keep the identifier
        i = 2
        while i < len(n) and n[i] == 'L':
            i += 1
        j = i
        while j < len(n) and n[j].isdigit():
            j += 1
        if j > i:
            ln = int(n[i:j])
            base = n[j:j + ln]
            rest = n[j + ln:]
            return base + ('<' + rest[1:40] + '>' if rest.startswith('I') else '')
    return n[:70]


def is_step_start(name):
    """The first kernel of a decode step (see the module comment)."""
    s = short(name)
    if s.startswith('k_embed') or s.startswith('k_qembed'):
        return True
    # mangled: k_add_rmsnorm<Lb1ELi1EE...; demangled: k_add_rmsnorm<true, 1>
    m = re.match(r'k_add_rmsnorm<(?:Lb[01]ELi(\d+)E|(?:true|false), ?(\d+)>)', s)
    return bool(m) and (m.group(1) or m.group(2)) in ('1', '2')


def main():
    args = [a for a in sys.argv[1:] if not a.startswith('--')]
    show_all = '--all' in sys.argv
    rows = []
    with open(args[0]) as f:
        for x in csv.DictReader(f):
            try:
                rows.append((int(x['Start (ns)']), int(x['Duration (ns)']), x['Name']))
            except (KeyError, ValueError):
                continue
    rows.sort()
    starts = [i for i, r in enumerate(rows) if is_step_start(r[2])]
    which = int(args[1]) if len(args) > 1 else 12
    print('%d kernels, %d steps' % (len(rows), len(starts)))
    if which + 1 >= len(starts):
        print('not enough steps')
        return 1
    step = rows[starts[which]:starts[which + 1]]
    t0 = step[0][0]
    prev_end = t0
    agg = collections.OrderedDict()
    last_end = max(s + d for s, d, _ in step)
    print('step %d: %d kernels, %.1f us (first start -> last end); next step starts %.1f us after this one' %
          (which, len(step), (last_end - t0) / 1e3, (rows[starts[which + 1]][0] - t0) / 1e3))
    for i, (st, du, nm) in enumerate(step):
        en = st + du
        inc = max(0, en - prev_end)
        if show_all or i < 24 or i > len(step) - 8:
            print('%4d start %8.2f end %8.2f dur %7.2f inc %6.2f  %s' %
                  (i, (st - t0) / 1e3, (en - t0) / 1e3, du / 1e3, inc / 1e3, short(nm)))
        # a kernel template serves several roles (the q/k/v, output and
        # down GEMVs are one instantiation): name it by its predecessor too
        role = short(nm) + ('  after ' + short(step[i - 1][2]) if i > 0 else '')
        s = agg.setdefault(role, [0, 0.0, 0.0])
        s[0] += 1
        s[1] += inc / 1e3
        s[2] += du / 1e3
        prev_end = max(prev_end, en)
    print('per kernel and predecessor: calls, sum of increments (us), sum of durations (us), name')
    for k, v in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print('%5d %9.1f %9.1f  %s' % (v[0], v[1], v[2], k))
    return 0


if __name__ == '__main__':
    sys.exit(main())
