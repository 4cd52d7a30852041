//! An exhaustive model of the shared ledger's lock-free protocol (`src/shared.rs`): every
//! interleaving of two processes' charges and credits, a kill of either at any step, and a
//! reclaimer (dead leases, then the recount) running between any two steps.
//!
//! Each atomic operation of the real code is one step here, in the same order. Checked in every
//! reachable state:
//! - the container total never passes the budget;
//! - it never counts less than what live processes hold (what the driver has given them), so a
//!   reservation can never be granted on bytes someone still uses;
//! - once everyone has finished or died and the reclaimer has run, the total is exactly what the
//!   live processes hold: nothing is lost for good.

use std::collections::HashSet;

const LIMIT: u64 = 3;
const PROCS: usize = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Op {
    Reserve(u64),
    Release(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Lease {
    Free,
    Live,
    Reaping,
}

/// One process: its script, where it is in it, and what it holds by its own account.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Proc {
    script: Vec<Op>,
    op: usize,
    step: u8,
    /// Bytes the process holds: granted and not yet handed back to the driver.
    holds: u64,
    /// What a credit in progress takes from the total (`credited` in the real code).
    credit: u64,
    alive: bool,
}

/// The reclaimer's registers while it recounts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Recount {
    step: u8,
    doubt: u64,
    /// The total word read before the sum: bytes and version.
    seen: (u64, u64),
    sum: u64,
    quiet: bool,
    lease: usize,
}

/// The reclaimer giving back a dead lease: which, at which step, and what it swapped out of it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Reaping {
    lease: usize,
    step: u8,
    used: u64,
    in_flight: u64,
}

/// The region: a total word is `total` and its `version`; a lease word is `used` and `in_flight`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    total: u64,
    version: u64,
    suspect: u64,
    state: [Lease; PROCS],
    used: [u64; PROCS],
    in_flight: [u64; PROCS],
    procs: [Proc; PROCS],
    reaping: Option<Reaping>,
    recount: Option<Recount>,
    kills_left: u8,
}

impl State {
    fn live_holdings(&self) -> u64 {
        self.procs.iter().filter(|p| p.alive).map(|p| p.holds).sum()
    }

    fn check(&self) {
        assert!(self.total <= LIMIT, "total {} passed the budget: {self:?}", self.total);
        assert!(
            self.total >= self.live_holdings(),
            "total {} counts less than the live processes hold ({}): {self:?}",
            self.total,
            self.live_holdings()
        );
    }

    fn done(&self) -> bool {
        self.procs.iter().all(|p| !p.alive || p.op == p.script.len())
    }
}

/// The next states of `s`.
fn successors(s: &State) -> Vec<State> {
    let mut next = Vec::new();
    for k in 0..PROCS {
        let p = &s.procs[k];
        if !p.alive || p.op == p.script.len() {
            continue;
        }
        if s.kills_left > 0 {
            let mut t = s.clone();
            t.procs[k].alive = false;
            t.kills_left -= 1;
            next.push(t);
        }
        next.push(step_process(s, k));
    }
    next.extend(step_reclaimer(s));
    next
}

/// One step of process `k`, as `SharedLedger::charge` and `SharedLedger::release` take them.
fn step_process(s: &State, k: usize) -> State {
    let mut t = s.clone();
    let p = &mut t.procs[k];
    let op = p.script[p.op];
    let finish = |p: &mut Proc| {
        p.op += 1;
        p.step = 0;
    };
    match (op, p.step) {
        // charge: announce, swap the total, apply and withdraw in one add.
        (Op::Reserve(_), 0) => {
            t.in_flight[k] += 1;
            p.step = 1;
        }
        (Op::Reserve(b), 1) => {
            if t.total + b <= LIMIT {
                t.total += b;
                t.version += 1;
                p.step = 2;
            } else {
                p.step = 10; // refused: withdraw the announcement
            }
        }
        (Op::Reserve(_), 10) => {
            t.in_flight[k] -= 1;
            finish(p);
        }
        (Op::Reserve(b), 2) => {
            t.used[k] += b;
            t.in_flight[k] -= 1;
            // Granted: the driver now gives the process its memory.
            p.holds += b;
            finish(p);
        }
        // The hook hands the memory back to the driver, then credits it.
        (Op::Release(b), 0) => {
            p.holds -= b.min(p.holds);
            p.step = 1;
        }
        (Op::Release(b), 1) => {
            p.credit = b.min(t.used[k]);
            t.used[k] -= p.credit;
            t.in_flight[k] += 1;
            p.step = 2;
        }
        (Op::Release(_), 2) => {
            t.total = t.total.saturating_sub(p.credit);
            t.version += 1;
            p.step = 3;
        }
        (Op::Release(_), 3) => {
            t.in_flight[k] -= 1;
            finish(p);
        }
        other => unreachable!("{other:?}"),
    }
    t
}

/// One step of the reclaimer: `reap` (claim a dead lease, give it back) then `recount`.
fn step_reclaimer(s: &State) -> Vec<State> {
    let mut t = s.clone();
    if let Some(r) = t.reaping.as_mut() {
        let k = r.lease;
        match r.step {
            1 => {
                r.used = std::mem::take(&mut t.used[k]);
                r.in_flight = std::mem::take(&mut t.in_flight[k]);
            }
            2 => {
                if r.used > 0 {
                    t.total = t.total.saturating_sub(r.used);
                    t.version += 1;
                }
            }
            3 => {
                if r.in_flight > 0 {
                    t.suspect += 1;
                }
            }
            _ => {
                t.state[k] = Lease::Free;
                t.reaping = None;
                return vec![t];
            }
        }
        r.step += 1;
        return vec![t];
    }
    if let Some(r) = t.recount.as_mut() {
        match r.step {
            0 => r.doubt = s.suspect,
            1 => r.seen = (s.total, s.version),
            2 => {
                // One lease read per step, as the scan reads them one by one.
                if r.lease < PROCS {
                    match s.state[r.lease] {
                        Lease::Free => {}
                        Lease::Reaping => r.quiet = false,
                        Lease::Live if s.in_flight[r.lease] != 0 => r.quiet = false,
                        Lease::Live => r.sum += s.used[r.lease],
                    }
                    r.lease += 1;
                    return vec![t];
                }
            }
            3 => {
                if !r.quiet || (s.total, s.version) != r.seen || r.seen.0 < r.sum {
                    t.recount = None; // not a quiet moment: try again later
                    return vec![t];
                }
            }
            _ => {
                if (s.total, s.version) == r.seen {
                    let (sum, doubt) = (r.sum, r.doubt);
                    t.total = sum;
                    t.version += 1;
                    t.suspect = t.suspect.saturating_sub(doubt);
                }
                t.recount = None;
                return vec![t];
            }
        }
        r.step += 1;
        return vec![t];
    }
    // Idle: claim a dead lease, or start a recount when something is in doubt.
    let mut next = Vec::new();
    for k in 0..PROCS {
        if s.state[k] == Lease::Live && !s.procs[k].alive {
            let mut t = s.clone();
            t.state[k] = Lease::Reaping;
            t.reaping = Some(Reaping { lease: k, step: 1, used: 0, in_flight: 0 });
            next.push(t);
        }
    }
    if s.suspect > 0 {
        let mut t = s.clone();
        t.recount = Some(Recount { quiet: true, ..Recount::default() });
        next.push(t);
    }
    next
}

/// Lets the reclaimer alone run to the end: every dead lease given back, recounts until settled.
fn settle(mut s: State) -> State {
    for _ in 0..1000 {
        let next = step_reclaimer(&s);
        match next.into_iter().next() {
            Some(t) => s = t,
            None => return s,
        }
    }
    panic!("the reclaimer never settles: {s:?}");
}

fn explore(scripts: [Vec<Op>; PROCS], kills: u8) -> usize {
    let start = State {
        total: 0,
        version: 0,
        suspect: 0,
        state: [Lease::Live; PROCS],
        used: [0; PROCS],
        in_flight: [0; PROCS],
        procs: scripts.map(|script| Proc { script, op: 0, step: 0, holds: 0, credit: 0, alive: true }),
        reaping: None,
        recount: None,
        kills_left: kills,
    };
    let mut seen = HashSet::new();
    let mut stack = vec![start];
    while let Some(s) = stack.pop() {
        if !seen.insert(s.clone()) {
            continue;
        }
        s.check();
        let next = successors(&s);
        if s.done() && s.reaping.is_none() && s.recount.is_none() {
            let end = settle(s.clone());
            end.check();
            assert_eq!(end.total, end.live_holdings(), "bytes lost for good: {end:?}");
            assert_eq!(end.suspect, 0, "{end:?}");
        }
        stack.extend(next);
    }
    seen.len()
}

#[test]
fn no_interleaving_overshoots_or_loses_bytes_with_one_kill() {
    use Op::*;
    let states =
        explore([vec![Reserve(2), Release(2), Reserve(1)], vec![Reserve(2), Reserve(1), Release(1)]], 1);
    eprintln!("{states} states explored");
    assert!(states > 5_000, "the model explored too little: {states}");
}

#[test]
fn no_interleaving_overshoots_or_loses_bytes_when_both_die() {
    use Op::*;
    let states = explore([vec![Reserve(1), Reserve(2), Release(1)], vec![Reserve(3), Release(3)]], 2);
    eprintln!("{states} states explored");
    assert!(states > 5_000, "the model explored too little: {states}");
}
