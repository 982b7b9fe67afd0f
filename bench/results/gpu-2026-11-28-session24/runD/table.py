# Per run (=== block) and mode: the slowest worker's median (ms); gates timed out (all workers).
import json, re, sys, collections
runs = []; cur = None; match = []
for line in open(sys.argv[1]):
    if line.startswith('==='):
        p = line.split(); cur = {'tag': p[1], 'model': p[3], 'modes': collections.defaultdict(list)}; runs.append(cur)
    m = re.search(r'RESULT (\{.*\})', line)
    if m and cur is not None:
        r = json.loads(m.group(1))
        if r.get('bench') == 'wsync_sync': cur['modes'][r['mode']].append(r)
        if 'checksum_match' in r: match.append(r['checksum_match'])
table = collections.defaultdict(list)
for run in runs:
    for mode, rs in run['modes'].items():
        slow = max(x['median_s'] for x in rs) * 1e3
        gates = sum(x.get('put_gates', 0) for x in rs); to = sum(x.get('put_gates_timed_out', 0) for x in rs)
        table[(run['model'], mode, run['tag'])].append(f"{slow:.2f}" + (f" (gates {gates}, timed out {to})" if run['tag'] == 'gates' else ''))
for k in sorted(table): print(*k, ' | '.join(table[k]))
print('checksums matched:', all(match), len(match))
