#!/usr/bin/env python3
"""Instructions per call of nolock's hot scripts, beside minimal references.

    python3 benches/script_instructions.py                  # lua/ of this checkout
    python3 benches/script_instructions.py --lua OLD/lua    # another tree, e.g.
        # mkdir OLD && git archive <rev> lua | tar -x -C OLD
    python3 benches/script_instructions.py --tower PATH/rate_limit.lua
    python3 benches/script_instructions.py --ablate [gcra|count|bucket|window|pair]
        # the target rows, one contract removed at a time (all tables by default)
    python3 benches/script_instructions.py --only pair   # the rows whose label has "pair"

Runs `redis-server` (PATH, or $NOLOCK_REDIS_SERVER) under
`valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no
--toggle-collect=processCommand` on its own port, sends N EVALSHAs of each
script one at a time with instrumentation on, and prints instructions per
call. Only the command itself is counted: `processCommand` (lookup, ACL
check, `call`: the script and every command it calls, the propagation of its
writes), not the reading and parsing of the request, the writing of the reply
to the socket, nor the server's timers (`serverCron`, active expiry) that
happen to run between two calls. Unlike `usec_per_call` the count does not
move with the machine's load, so runs of different trees compare. Every
figure includes the dispatch of one command (the `return 1` row). A program,
not a test.

Every key a row measures stays present for the whole run: admitting rows
have room for far more calls than a run makes (a burst of 10^6 at 1 s per
unit, windows of an hour), denying rows are exhausted by the warm-up and keep
their state for an hour, and a peek reads a state a check wrote first. After
each row the script checks that its keys still have a TTL longer than the run
took, so a row that measured an expired (and recreated) key is refused, not
printed. Each rate check is printed for its admitting and its denying path.

Scripts are composed as `src/script/compose.rs` does (each `--@include
lib/<name>` replaced by the helper without its header, helpers first and
once, `SCRIPT_NAME` before the first, or before the code of a script that
names it without any); the references are the `REF_*`
scripts of `examples/rate_cost.rs`.
"""
import argparse, glob, os, re, socket, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKEN = '0123456789abcdef0123456789abcdef'
# In a call's arguments: the lock value the previous call's grant stored,
# "<fence>:<token>" (nolock's release names the grant it ends, fence included).
HELD = object()


def compose(lua, name):
    included, out = [], []

    def body(code):
        lines = code.split('\n')
        i = 0
        while i < len(lines) - 1 and (not lines[i].strip() or (
                lines[i].strip().startswith('--') and not lines[i].strip().startswith('--@include '))):
            i += 1
        return '\n'.join(lines[i:])

    def splice(src):
        for line in src.splitlines(keepends=True):
            if not line.rstrip().startswith('--@include '):
                out.append(line)
                continue
            path = line.rstrip()[len('--@include '):].strip()
            if path in included:
                continue
            if not included:
                out.append("local SCRIPT_NAME = '%s'\n" % name)
            included.append(path)
            code = body(open(os.path.join(lua, path + '.lua')).read())
            deps = ''.join(l for l in code.splitlines(keepends=True)
                           if l.lstrip().startswith('--@include '))
            rest = code[len(code) - len(code.lstrip()):] if not deps else code.split(deps.splitlines()[-1], 1)[1]
            splice(deps)
            out.append('-- %s\n' % path + rest.lstrip('\n'))
            if not out[-1].endswith('\n'):
                out.append('\n')

    splice(open(os.path.join(lua, name + '.lua')).read())
    composed = ''.join(out)
    if not included and 'SCRIPT_NAME' in composed:
        # A script that writes its errors in place: its name before its code.
        shebang = composed.index('\n') + 1 if composed.startswith('#!') else 0
        header = len(composed) - len(body(composed[shebang:]))
        composed = composed[:header] + "local SCRIPT_NAME = '%s'\n" % name + composed[header:]
    return composed


def references():
    text = open(os.path.join(ROOT, 'examples', 'rate_cost.rs')).read()
    return dict(re.findall(r'const (REF_[A-Z]+): &str = r"\n(.*?)";', text, re.S))


def resp(*parts):
    out = [b'*%d\r\n' % len(parts)]
    for p in parts:
        p = str(p).encode()
        out.append(b'$%d\r\n%s\r\n' % (len(p), p))
    return b''.join(out)


class Conn:
    def __init__(self, port):
        self.sock = socket.create_connection(('127.0.0.1', port))
        self.file = self.sock.makefile('rb')

    def cmd(self, *parts):
        self.sock.sendall(resp(*parts))
        return self.read()

    def read(self):
        line = self.file.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b'-':
            raise RuntimeError(rest.decode())
        if kind in (b'+', b':'):
            return rest.decode() if kind == b'+' else int(rest)
        if kind == b'$':
            n = int(rest)
            return None if n < 0 else self.file.read(n + 2)[:-2].decode()
        n = int(rest)
        return None if n < 0 else [self.read() for _ in range(n)]


# Arguments that keep every key present for a run (see the module docs):
# GCRA and token bucket (cost, T us, burst): each admit adds 1 s to a burst
# of 10^6; a deny has a burst of 1 at 1 h per unit. Windows (cost, w ms,
# limit): an hour's window, of 10^9 or of 1.
ADMIT, DENY = [1, 1000000, 1000000], [1, 3600000000, 1]
WINDOW_ADMIT, WINDOW_DENY = [1, 3600000, 1000000000], [1, 3600000, 1]
# Calendar (cost, h, L, b0..b3): the server's time lies in [1, 2100), a
# period that keeps the key; of 10^9, or of 1.
CAL_PERIODS = [0, 1, 4102444800000, 4102444800001]
CAL_ADMIT, CAL_DENY = [1, 7, 1000000000, *CAL_PERIODS], [1, 7, 1, *CAL_PERIODS]
# try_increment and the reference counter (limit, w ms, n).
COUNT_ADMIT, COUNT_DENY = [1 << 50, 3600000, 1], [1, 3600000, 1]


def one(label, src, keys, args, setup=()):
    """A row of one script; `setup`: commands sent once before it."""
    return (label, [src], [(0, keys, args)], list(setup))


def cases(lua, tower):
    refs = references()
    mine = lambda name: compose(lua, name)
    rows = [
        one('EVALSHA of return 1 (dispatch)', 'return 1', [], []),
        one('reference: 10-line bounded counter, admit', refs['REF_COUNTER'], ['rca'], COUNT_ADMIT),
        one('reference: 10-line bounded counter, deny', refs['REF_COUNTER'], ['rcd'], COUNT_DENY),
        one('limits/try_increment, admit', mine('limits/try_increment'), ['tia'], COUNT_ADMIT),
        one('limits/try_increment, deny', mine('limits/try_increment'), ['tid'], COUNT_DENY),
        one('reference: minimal GCRA, admit', refs['REF_GCRA'], ['rga'], ADMIT),
        one('reference: minimal GCRA, deny', refs['REF_GCRA'], ['rgd'], DENY),
    ]
    if tower:
        # Read as (capacity, emission interval in µs), the order earlier
        # runs sent: a capacity of 10^6 at 1 s each admits; 1 at 1 h denies
        # after the first. The key check below refuses the row if the key
        # did not stay.
        src = open(tower).read()
        rows += [one('tower-rate-limit-redis GCRA, admit', src, ['twa'], [1000000, 1000000]),
                 one('tower-rate-limit-redis GCRA, deny', src, ['twd'], [1, 3600000000])]
    for alg, a, d in [('gcra', ADMIT, DENY), ('token_bucket', ADMIT, DENY),
                      ('sliding_window', WINDOW_ADMIT, WINDOW_DENY),
                      ('fixed_window', WINDOW_ADMIT, WINDOW_DENY)]:
        src = mine('rate/%s/check' % alg)
        rows += [one('rate/%s/check, admit' % alg, src, [alg + 'a'], a),
                 one('rate/%s/check, deny' % alg, src, [alg + 'd'], d)]
    if os.path.exists(os.path.join(lua, 'rate', 'calendar', 'check.lua')):
        src = mine('rate/calendar/check')
        rows += [one('rate/calendar/check, admit', src, ['cala'], CAL_ADMIT),
                 one('rate/calendar/check, deny', src, ['cald'], CAL_DENY)]
    # A peek of a state one check wrote (a missing key is another path): a
    # charge of 1000 units at 1 s each, so it stays 1000 s.
    rows.append(one('rate/gcra/peek', mine('rate/gcra/peek'), ['gp'], ADMIT,
                    [('EVAL', mine('rate/gcra/check'), 1, 'gp', 1000, *ADMIT[1:])]))
    rows.append(one('rate/gcra/check, 3 limits, admit', mine('rate/gcra/check'),
                    ['m{x}1', 'm{x}2', 'm{x}3'],
                    [1, 1000000, 1000000, 2000000, 1000000, 3000000, 1000000]))
    rows.append(one('rate/sliding_window/check, 3 limits, admit', mine('rate/sliding_window/check'),
                    ['w{x}1', 'w{x}2', 'w{x}3'],
                    [1, 3600000, 100000000, 7200000, 100000000, 10800000, 100000000]))
    rows.append(('reference: SET NX PX + INCR, token-checked release (pair)',
                 [refs['REF_ACQUIRE'], refs['REF_RELEASE']],
                 [(0, ['{r}', '{r}:fence'], [TOKEN, 30000]), (1, ['{r}'], [TOKEN])], []))
    # The release as nolock sends it: since the waiting flag, with the flag's
    # key (it publishes only while the flag exists, on a channel named after
    # it); before, with the channel (it always published).
    flagged = 'waiting flag' in open(os.path.join(lua, 'fence', 'release.lua')).read()
    acquire, release = mine('fence/acquire'), mine('fence/release')
    sent = lambda t: (([t + ':lock', t + ':waiting'], [HELD]) if flagged
                      else ([t + ':lock'], [HELD, t + ':released']))
    rows.append(('fence/acquire + fence/release (pair)', [acquire, release],
                 [(0, ['{f}:lock', '{f}:fence'], [TOKEN, 30000]), (1, *sent('{f}'))], []))
    if flagged:
        # A waiter's flag present (an hour long): the release publishes.
        rows.append(('fence/acquire + fence/release, a waiter waits (pair)', [acquire, release],
                     [(0, ['{h}:lock', '{h}:fence'], [TOKEN, 30000]), (1, *sent('{h}'))],
                     [('SET', '{h}:waiting', 1, 'PX', 3600000)]))
    # The floor: the same pair with no channel (and no flag) at all.
    rows.append(('fence/acquire + fence/release without the PUBLISH (pair)', [acquire, release],
                 [(0, ['{g}:lock', '{g}:fence'], [TOKEN, 30000]), (1, ['{g}:lock'], [HELD])], []))
    # A check of 2 and a refund of 1 (the refund gives back and writes its
    # record, a fresh one per pair): what a refund costs on top of its check.
    # Trees before the reset markers took no marker key.
    marked = 'reset marker' in open(os.path.join(lua, 'lib', 'refund.lua')).read()
    for alg, params in [('gcra', [1000000, 100000]), ('token_bucket', [1000000, 100000])]:
        key = '{%s}' % alg[0]
        keys = [key, lambda reply, n, k=key: '%s:charge#%d' % (k, n)] + ([key + ':reset'] if marked else [])
        # amount 1, actual 0, at (the check's time), cost 2, deadline 1 h on
        # (before the markers a refund sent 0: a deadline made it a
        # settlement), no cap; the limit's T and burst, held 2, reset 0.
        deadline = (lambda reply, n: reply[1] // 1000 + 3600000) if marked else 0
        argv = [1, 0, lambda reply, n: reply[1], 2, deadline, 9007199254740991, *params, 2, 0]
        rows.append(('rate/%s/check + refund (pair)' % alg,
                     [mine('rate/%s/check' % alg), mine('rate/%s/refund' % alg)],
                     [(0, [key], [2, *params]), (1, keys, argv)], []))
    return rows


# What each contract of the target rows costs (and, for the GCRA check,
# each difference of shape from tower-rate-limit-redis's script), measured
# by removing it from the composed script: an edit is (script index, old
# text, new text[, 'optional']). The rows are not correct limiters: each
# drops something. `--ablate NAME` runs one table, `--ablate` all of them.
ABLATIONS = {
    'gcra': [
        ('strict parsing of the stored TAT (a plain tonumber instead)',
         [(0, "local v = #stored <= 16 and (stored == '0' or string.find(stored, '^[1-9]%d*$')) and stored + 0",
           'local v = tonumber(stored)')]),
        ('checks of the interval, burst and cost arguments',
         [(0, 'if step % 1 ~= 0 or b % 1 ~= 0 or step < 1 or b < 1\n'
              '    or b * step > MAX_FILL or cost > b then', 'if false then'),
          (0, 'if cost % 1 ~= 0 or cost < 1 or cost > 9007199254740991 then', 'if false then')]),
        ('the server time in the reply (0 sent in its place)',
         [(0, 'local reply, admitted = {0, now, now}, 1', 'local reply, admitted = {0, 0, now}, 1')]),
        ('the tag (a bare TAT, as tower)',
         [(0, "local tag = 'g' .. ARGV[2 * i] .. 'x' .. ARGV[2 * i + 1] .. ':'", "local tag = ''"),
          (0, "'g' .. ARGV[2 * i] .. 'x' .. ARGV[2 * i + 1] .. ':' .. string.format('%d', t)",
           "string.format('%d', t)")]),
        # Not contracts: the shape of the script, against tower's.
        ('the cost argument (a cost of 1, not parsed)',
         [(0, 'local cost = ARGV[1] + 0', 'local cost = 1')]),
        ('the loops over 1 to n limits (one limit, no loop)',
         [(0, 'for i = 1, n do', 'do local i = 1'), (0, 'for i = 1, n do', 'do local i = 1')]),
        ('PXAT (PX from now, as tower)',
         [(0, "'PXAT', string.format('%d', math.ceil(t / 1000)))",
           "'PX', string.format('%d', math.ceil((t - now) / 1000)))")]),
    ],
    'count': [
        ('strict parsing of the stored count (a plain tonumber)',
         [(0, "local count = #raw <= 16 and (raw == '0' or string.find(raw, '^[1-9]%d*$')) and raw + 0",
           'local count = tonumber(raw)')]),
        ('checks of the limit, window and n arguments',
         [(0, 'if limit % 1 ~= 0 or limit < 1 or limit > MAX then', 'if false then'),
          (0, 'if window % 1 ~= 0 or window < 1 or window > MAX then', 'if false then'),
          (0, 'if n % 1 ~= 0 or n < 1 or n > MAX then', 'if false then'),
          (0, 'if n > limit then', 'if false then')]),
        ('the TTL in the reply, and the repair of a counter without one (PTTL)',
         [(0, "local pttl = redis.call('PTTL', KEYS[1])", 'local pttl = 0')]),
        ('the tag (a bare count written with INCRBY, as the reference)',
         [(0, "local prefix = 'c' .. ARGV[1] .. 'x' .. ARGV[2] .. ':'", "local prefix = ''"),
          (0, "redis.call('SET', KEYS[1], value, 'KEEPTTL')", "redis.call('INCRBY', KEYS[1], n)")]),
    ],
    'bucket': [
        ('strict parsing of the stored numbers (digits, length, no leading zero)',
         [(0, '    if not k or not a or k > MAX or a > MAX or (#ks > 1 and k < 10 ^ (#ks - 1))\n'
              '      or (#as > 1 and a < 10 ^ (#as - 1)) then', '    if not k then'),
          (0, "ks, as = string.match(stored, '^(%d+):(%d+)$', len + 1)",
           "ks, as = string.match(stored, '^([^:]*):(.*)$', len + 1)")]),
        ('checks of the interval, capacity and cost arguments',
         [(0, 'if step % 1 ~= 0 or cap % 1 ~= 0 or step < 1 or cap < 1\n'
              '    or cap * step > MAX_FILL then', 'if false then'),
          (0, 'if cost > cap then', 'if false then'),
          (0, 'if cost % 1 ~= 0 or cost < 1 or cost > MAX then', 'if false then')]),
        ('the server time in the reply (0 sent in its place)',
         [(0, 'local reply, admitted = {0, now, 0, 0}, 1', 'local reply, admitted = {0, 0, 0, 0}, 1')]),
    ],
    'window': [
        ('strict parsing of the stored numbers (digits, length, no leading zero)',
         [(0, '    if not s or s > MAX or c > MAX or p > MAX or (#ss > 1 and s < 10 ^ (#ss - 1))\n'
              '      or (#cs > 1 and c < 10 ^ (#cs - 1)) or (#ps > 1 and p < 10 ^ (#ps - 1)) then',
           '    if not s then'),
          (0, "ss, cs, ps = string.match(stored, '^(%d+):(%d+):(%d+)$', len + 1)",
           "ss, cs, ps = string.match(stored, '^([^:]*):([^:]*):(.*)$', len + 1)")]),
        ('checks of the window, limit and cost arguments',
         [(0, 'if w % 1 ~= 0 or l % 1 ~= 0 or w < 1 or l < 1 or l * w > MAX then', 'if false then'),
          (0, 'if cost > l then', 'if false then'),
          (0, 'if cost % 1 ~= 0 or cost < 1 or cost > MAX then', 'if false then')]),
        ('the server time in the reply (0 sent in its place)',
         [(0, 'local reply, admitted = {0, micros, 0, 0, 0}, 1',
           'local reply, admitted = {0, 0, 0, 0, 0}, 1')]),
    ],
    'pair': [
        ("the waiting flag's EXISTS in the release (the PUBLISH that wakes waiters)",
         [(1, "if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 1 then", 'if false then')]),
        ('the strict check of the fence counter before the first write',
         [(0, "local incrementable = not counter or type(counter) == 'string' and #counter <= 19\n"
              "  and string.find(counter, '^[1-9]%d*$') ~= nil", 'local incrementable = true')]),
        ('checks of the token, TTL and flag arguments',
         [(0, "if token == nil or token == '' then", 'if false then'),
          (0, 'if not ttl or ttl % 1 ~= 0 or ttl < 1 or ttl > 9007199254740991 then', 'if false then'),
          (1, "if holder == nil or holder == '' then", 'if false then'),
          (1, "if KEYS[2] and string.sub(KEYS[2], -8) ~= ':waiting' then", 'if false then')]),
        ('the counter read before the lock is taken (GET; the fence computed from it)',
         [(0, "local counter = redis.pcall('GET', KEYS[2])", 'local counter = nil')]),
    ],
}


def ablation_rows(lua):
    """Each table's row: its label, its composed sources, and the calls of
    its admitting and denying paths (a pair has one path, its two calls)."""
    pair = [(0, ['{f}:lock', '{f}:fence'], [TOKEN, 30000]),
            (1, ['{f}:lock', '{f}:waiting'], [HELD])]
    one = lambda argv: [(0, ['k'], argv)]
    return {
        'gcra': ('rate/gcra/check', ['rate/gcra/check'],
                 [('admit', one(ADMIT)), ('deny', one(DENY))]),
        'count': ('limits/try_increment', ['limits/try_increment'],
                  [('admit', one(COUNT_ADMIT)), ('deny', one(COUNT_DENY))]),
        'bucket': ('rate/token_bucket/check', ['rate/token_bucket/check'],
                   [('admit', one(ADMIT)), ('deny', one(DENY))]),
        'window': ('rate/sliding_window/check', ['rate/sliding_window/check'],
                   [('admit', one(WINDOW_ADMIT)), ('deny', one(WINDOW_DENY))]),
        'pair': ('fence/acquire + fence/release', ['fence/acquire', 'fence/release'],
                 [('pair', pair)]),
    }


def ablations(lua, which):
    """Rows of each chosen table: the script as shipped, one contract
    removed at a time, then all of them; every row on keys of its own."""
    rows = []
    for name, (label, names, paths) in ablation_rows(lua).items():
        if which not in ('all', name):
            continue
        sources = [compose(lua, n) for n in names]
        every = list(sources)
        variants = [('nothing (as shipped)', sources)]
        for what, edits in ABLATIONS[name]:
            srcs = list(sources)
            for i, old, new, *optional in edits:
                if old not in srcs[i]:
                    sys.exit('--ablate %s: the script no longer contains %r; update ABLATIONS'
                             % (name, old))
                srcs[i] = srcs[i].replace(old, new, 1)
                if old in every[i]:
                    every[i] = every[i].replace(old, new, 1)
                elif not optional:
                    sys.exit('--ablate %s: %r was already edited away; reorder ABLATIONS'
                             % (name, old))
            variants.append((what, srcs))
        variants.append(('all of the above', every))
        for n, (what, srcs) in enumerate(variants):
            for path, calls in paths:
                # Keys of the row's own: stored forms differ between rows
                # (a tagged state, a bare one); the pair's keep their slot.
                own = lambda k: (k.replace('{f}', '{f%d}' % n) if '{' in k
                                 else '%s:%s%d%s' % (name, k, n, path))
                rows.append(('%s without %s, %s' % (label, what, path), srcs,
                             [(i, [own(k) for k in keys], argv) for i, keys, argv in calls], []))
    return rows


def dump_total(out, control):
    """Dump the counts and read the instructions of the new dump (numbered
    one above the last; waited for, as the server may take a moment)."""
    number = lambda path: int(path.rsplit('.', 1)[1])
    before = max([number(p) for p in glob.glob(out + '.*')] or [0])
    control('-d')
    for _ in range(100):
        dumps = [p for p in glob.glob(out + '.*') if number(p) > before]
        if dumps:
            text = open(max(dumps, key=number)).read()
            totals = [int(l.split()[1]) for l in text.splitlines()
                      if l.startswith(('summary:', 'totals:'))]
            if totals:
                return totals[-1]
        time.sleep(0.1)
    sys.exit('callgrind wrote no dump')


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--lua', default=os.path.join(ROOT, 'lua'))
    parser.add_argument('--tower', help="tower-rate-limit-redis's scripts/rate_limit.lua")
    parser.add_argument('--calls', type=int, default=1000)
    parser.add_argument('--port', type=int, default=26411)
    parser.add_argument('--only', help='only the rows whose label contains this')
    parser.add_argument('--ablate', nargs='?', const='all', choices=['all', *ABLATIONS],
                        help='the target rows with one contract removed at a time '
                             '(one table, or all)')
    args = parser.parse_args()
    server = os.environ.get('NOLOCK_REDIS_SERVER', 'redis-server')
    rows = cases(args.lua, args.tower)
    if args.only:
        rows = rows[:1] + [r for r in rows[1:] if args.only in r[0]]
    if args.ablate:
        rows = rows[:1] + [r for r in rows if r[0].startswith(('reference', 'tower'))] \
            + ablations(args.lua, args.ablate)
    with tempfile.TemporaryDirectory() as dir:
        out = os.path.join(dir, 'callgrind.out')
        # Collected only inside processCommand: the command as dispatched,
        # without the request's parsing, the reply's socket write and the
        # timers (serverCron) that run between commands. Not `call`: a
        # script's redis.call enters it again, and a toggle there would turn
        # collection off for the commands the script calls.
        proc = subprocess.Popen(['valgrind', '--tool=callgrind', '--instr-atstart=no',
                                 '--collect-atstart=no', '--toggle-collect=processCommand',
                                 '--callgrind-out-file=' + out, server, '--port', str(args.port),
                                 '--save', '', '--appendonly', 'no', '--dir', dir],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        control = lambda *a: subprocess.run(['callgrind_control', *a, str(proc.pid)], check=True,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(300):
                try:
                    conn = Conn(args.port)
                    conn.cmd('PING')
                    break
                except OSError:
                    time.sleep(0.2)
            version = re.search(r'redis_version:(\S+)', conn.cmd('INFO', 'server')).group(1)
            print('redis %s under callgrind; %d calls per row; instructions per call'
                  % (version, args.calls))
            print('| script | instructions per call |\n|---|---:|')
            for label, sources, calls, setup in rows:
                shas = [conn.cmd('SCRIPT', 'LOAD', s) for s in sources]
                for command in setup:
                    conn.cmd(*command)

                count = [0]

                def run():
                    reply = None
                    count[0] += 1
                    for i, keys, argv in calls:
                        # HELD: the lock value of the grant just taken; a
                        # function: a value from the previous reply and the
                        # run's number (a charge's time, a fresh record key).
                        now = lambda v: v(reply, count[0]) if callable(v) else v
                        argv = ['%s:%s' % (reply[1], TOKEN) if a is HELD else now(a) for a in argv]
                        keys = [now(k) for k in keys]
                        reply = conn.cmd('EVALSHA', shas[i], len(keys), *keys, *argv)
                    if 'refund' in label and reply[0] != 0:
                        sys.exit('%s: the refund answered %r' % (label, reply))
                    if 'refund' not in label and len(calls) == 2 and reply not in ([1], 1):
                        sys.exit('%s: the release did not release (%r), so the row would '
                                 'measure a refused release and a re-entry' % (label, reply))

                for _ in range(3):
                    run()  # warm up (and exhaust the deny rows)
                # The state the row keeps: every key that exists after the
                # warm-up (a fence pair's lock is gone after each release,
                # a refund's record is new each time).
                kept = [k for _, keys, _ in calls for k in keys
                        if not callable(k) and conn.cmd('EXISTS', k)]
                # Measured twice; the lower count is printed, and both when
                # they differ by more than 3% (a dump read too early, or
                # work of the server's that landed in one of them).
                counts = []
                for _ in range(2):
                    control('-z')
                    control('-i', 'on')
                    began = time.monotonic()
                    for _ in range(args.calls):
                        run()
                    took_ms = (time.monotonic() - began) * 1000
                    control('-i', 'off')
                    for key in kept:
                        pttl = conn.cmd('PTTL', key)
                        if pttl != -1 and pttl < took_ms:
                            sys.exit('%s: %s has a PTTL of %r ms after a run of %.0f ms: it may '
                                     'have expired during the run' % (label, key, pttl, took_ms))
                    counts.append(dump_total(out, control) / args.calls / 1000)
                low, high = min(counts), max(counts)
                spread = '' if high <= low * 1.03 else ' (and %.1f k)' % high
                print('| %s | %.1f k%s |' % (label, low, spread), flush=True)
        finally:
            proc.terminate()
            proc.wait()


if __name__ == '__main__':
    sys.exit(main())
