/*
 * airlock's request protocol as a SPIN model (issue 20).
 *
 * What is modelled: two concurrent requests from an agent that may replay a
 * request, present a ticket twice or with another request or binding (a
 * compromised intake), and swap the binary after approval; intake, approval,
 * two runner workers and the journal, each of which may crash (approval and
 * the journal restart; a crashed intake or runner job is simply gone, and the
 * agent's retry meets what the journal kept); an
 * operator who holds, releases, approves and denies; the approval timeout and
 * the agent hanging up while its request is pending.  Every actor acts a
 * bounded number of times, so the state space is finite and searched whole.
 *
 * What is abstracted away: the policy (each decide chooses allow, deny or ask
 * nondeterministically), the content of commands (a request is its number),
 * digests (equal numbers), the binary (one path whose identity is 0 or 1),
 * time (timeout and expiry are nondeterministic events), and the journal's
 * hash chain (the journal is a set of durable facts).  Each service's code
 * between two awaits is one atomic step, as asyncio runs it.
 *
 * The properties are assertions, checked in every reachable state:
 *   P1 a job starts only after a ticket for exactly that request and that
 *      binary identity was redeemed;
 *   P2 a ticket is redeemed at most once, across runner restarts;
 *   P3 exec.started is durable before the job starts, and so are the
 *      request's claim and its decision, though both were appended without
 *      waiting (deferred: they become durable with the next durable commit,
 *      and a journal crash before it loses them);
 *   P4 no ticket that a policy rule issued is issued or redeemed while the
 *      operator's hold is on (durably), across approval restarts;
 *   P5 a denied, expired, interrupted or withdrawn request never runs, and a
 *      request runs at most once.
 *
 * Broken variants, each compiled with one -D flag, must each violate a
 * property (make model checks that they do):
 *   BROKEN_HOLD_MEMORY   approval forgets the hold when it restarts
 *   BROKEN_REDEEM        redeem checks the ticket, then invalidates it later
 *   BROKEN_AUDIT         exec.started is written after the spawn
 *   BROKEN_IDENTITY      the runner runs the path again instead of the fd it checked
 *   BROKEN_WITHDRAW      a request whose agent hung up stays approvable
 *   BROKEN_DEFER         exec.started commits without checking that the
 *                        request's deferred records survived (its marks' boot)
 *
 * Persons (issue 27) are a second configuration of this file, compiled with
 * -DPERSONS (its own init, at the end): one pending request under a rule of
 * N approvals, and operators voting concurrently by uid or by any of their
 * keys.  Its property:
 *   P6 N approvals are N distinct persons, none of them the requester.
 * and its broken variant (compiled with -DPERSONS -DBROKEN_KEYS):
 *   BROKEN_KEYS          the tally counts credentials (a uid, a key) instead
 *                        of the persons they belong to
 *   BROKEN_RECHECK       a vote is checked only before it is journaled, not
 *                        again when it is counted (two votes of one person race)
 */

#define R 2          /* requests */
#define T 3          /* ticket slots: one per request, one spare for replays */
#define NOTICKET 255

#define NONE 0
#define ALLOW 1
#define DENY 2       /* denied, expired, withdrawn or interrupted: never runs */

/* --- the journal: durable facts ------------------------------------------ */
bool j_up = 1;
bool j_claimed[R];   /* op.begin: the operation ID is taken */
byte j_decided[R];   /* approval.decided */
bool j_started[R];   /* exec.started */
bool j_hold;         /* operator.action hold / release */
/* Deferred records (issue 21): queued in the journal's memory, not yet
   durable.  A durable commit (exec.started) commits every one queued before
   it; a journal crash loses them.  j_boot is the journal process's boot: a
   mark (what a deferred append answers) names it. */
bool d_claimed[R];   /* op.begin's claim and request.received (request 0's only:
                        request 1 never retries, so a lost claim of its would
                        show only in P3's claim part, which request 0 covers;
                        its claim commits at once, to keep the state space
                        within bounds) */
bool d_allowed[R];   /* a rule's approval.decided (allow) */
byte j_boot;

/* --- approval: memory, lost when it crashes ------------------------------- */
bool a_up = 1;
bool a_hold;
bool a_pending[R];
byte a_result[R];    /* what a pending request's wait ends with */
byte a_ticket[R];
bool t_valid[T];
byte t_req[T];
byte t_bound[T];     /* the binary identity approval saw */
bool t_policy[T];    /* issued by a policy rule, not by an operator */
bool t_early[T];     /* a rule's ticket whose deferred approval.decided has a mark
                        of boot 0: stale once the journal has crashed (an
                        operator's decision is durable when issued: never stale) */

/* --- the world ----------------------------------------------------------- */
byte bin_id = 0;     /* the identity of the file at the approved path */
bool hung_up[R];     /* the agent closed its connection */
bool withdrawn[R];   /* ... while its request was pending */

/* --- observations for the assertions ------------------------------------- */
byte redeemed[T];     /* redeems of the ticket now in each slot */
byte spawned[R];
byte approved_id[R] = 255;

chan to_runner = [2] of { byte, byte, byte };   /* request, ticket, bound */

/* A durable journal commit: the one writer commits its queue in order, so
   every deferred record queued before it is committed with it. */
inline flush() {
  j_claimed[0] = j_claimed[0] || d_claimed[0]; d_claimed[0] = 0;
  j_claimed[1] = j_claimed[1] || d_claimed[1]; d_claimed[1] = 0;
  if :: d_allowed[0] -> j_decided[0] = ALLOW; d_allowed[0] = 0 :: else -> skip fi;
  if :: d_allowed[1] -> j_decided[1] = ALLOW; d_allowed[1] = 0 :: else -> skip fi
}

/* Approval issues a ticket for request r, bound to what it sees now. */
inline issue(r, policy) {
  t = 0;
  do
  :: t < T && t_valid[t] -> t++
  :: t < T && !t_valid[t] -> break
  :: t == T -> break
  od;
  if
  :: t < T ->
     t_valid[t] = 1; t_req[t] = r; t_bound[t] = bin_id; t_policy[t] = policy; redeemed[t] = 0;
     t_early[t] = policy && j_boot == 0;
     approved_id[r] = bin_id;
     assert(!(policy && j_hold));                       /* P4 */
     a_ticket[r] = t; a_result[r] = ALLOW
  :: else -> a_ticket[r] = NOTICKET; a_result[r] = DENY  /* no room: fail closed */
  fi
}

proctype Intake(byte r) {
  byte t; byte b; byte verdict; byte mb;
  bool retried = 0;
again:
  /* op.begin: claim the operation ID, deferred: decided at once against what
     is committed and what is queued; a replay of a claimed ID runs nothing
     again.  The answer carries a mark naming the journal's boot. */
  atomic {
    if
    :: j_up && !j_claimed[r] && !d_claimed[r] ->
       if :: r == 0 -> d_claimed[r] = 1 :: else -> j_claimed[r] = 1 fi;
       mb = j_boot
    :: else -> goto done
    fi
  }
  /* decide: one atomic step of approval (policy chosen nondeterministically);
     the decision is journaled before it is answered (a rule's allow deferred).
     Its records name intake's mark: refused if the journal restarted since. */
  atomic {
    if
    :: !a_up || !j_up || mb != j_boot -> mb = 0; goto done   /* fail closed */
    :: a_up && j_up && mb == j_boot ->
       mb = 0;                                           /* not needed after this: keeps the state space small */
       if
       :: a_hold -> flush(); a_pending[r] = 1            /* allow becomes ask (approval.pending: durable) */
       :: !a_hold -> d_allowed[r] = 1; issue(r, 1)       /* a rule's allow: deferred */
       :: flush(); j_decided[r] = DENY; a_result[r] = DENY
       :: flush(); a_pending[r] = 1                      /* ask */
       fi
    fi
  }
  /* wait for the operator, the timeout, a crash of approval, or hang up */
  if
  :: a_pending[r] ->
     if
     :: atomic { !a_pending[r] -> skip }                 /* decided elsewhere */
     :: atomic {
          a_pending[r] -> hung_up[r] = 1; withdrawn[r] = 1;
#ifndef BROKEN_WITHDRAW
          a_pending[r] = 0; flush(); j_decided[r] = DENY; /* withdrawn; table: withdrawn */
#endif
          skip
        }
        if
        :: hung_up[r] && !a_pending[r] && a_result[r] != ALLOW -> goto done
        :: else -> atomic { !a_pending[r] -> skip }
        fi
     fi
  :: else -> skip
  fi;
  verdict = a_result[r];
  if
  :: verdict != ALLOW -> goto done
  :: else -> skip
  fi;
  if :: goto done :: skip fi;                            /* intake may crash here, ticket unused */
  t = a_ticket[r];
  b = t_bound[t];
  /* hand the work to the runner; a compromised intake may also send the
     ticket twice or with another request (another binding fails redeem's
     comparison in the same way as another request) */
  to_runner!r, t, b;
  if
  :: to_runner!r, t, b
  :: to_runner!(1 - r), t, b
  :: skip
  fi;
done:
  /* The agent retries the same operation once (a replay): it may overlap
     with the first attempt's job, which the runner may still be running. */
  if
  :: !retried && r == 0 -> atomic { retried = 1; t = 0; b = 0; verdict = 0; mb = 0 }; goto again
  :: skip
  fi
}

proctype Runner() {
  byte r; byte t; byte b; bool am; byte fd_id; byte exec_id;
  bool ok;
end_idle:
  do
  :: to_runner?r, t, b ->
     /* redeem: one atomic step of approval */
#ifndef BROKEN_REDEEM
     atomic {
       ok = a_up && t < T && t_valid[t] && t_req[t] == r && t_bound[t] == b && !(t_policy[t] && a_hold);
       if
       :: ok -> assert(!(t_policy[t] && j_hold));                         /* P4 */
                t_valid[t] = 0; redeemed[t]++; assert(redeemed[t] <= 1);  /* P2 */
                am = t_early[t]; t_early[t] = 0                   /* redeem hands over approval's mark */
       :: else -> skip
       fi
     }
#else
     ok = a_up && t < T && t_valid[t] && t_req[t] == r && t_bound[t] == b && !(t_policy[t] && a_hold);
     if
     :: ok -> t_valid[t] = 0; redeemed[t]++; assert(redeemed[t] <= 1); am = t_early[t]; t_early[t] = 0
     :: else -> skip
     fi;
#endif
     if
     :: !ok -> goto next
     :: ok -> skip
     fi;
     if :: goto next :: skip fi;                          /* the runner may crash here */
     /* open the binary from / with O_NOFOLLOW and compare its identity */
     fd_id = bin_id;
#ifndef BROKEN_IDENTITY
     if
     :: fd_id != b -> goto next                           /* binary_changed */
     :: else -> skip
     fi;
#endif
#ifndef BROKEN_AUDIT
     /* exec.started, durable, naming the request's marks: it commits with
        every deferred record queued before it, or -- if a mark is of an
        earlier boot (the journal crashed since) -- not at all.  The mark
        checked here is approval's, from redeem (am): a rule's decision was
        made at intake's mark's boot (decide checks it), so a crash since
        either shows in it; an operator's decision followed the durable
        approval.pending, which committed intake's records.  (The code also
        checks intake's marks, passed with the ticket: defence in depth, the
        same outcome here, and left out to keep the state space small.) */
     atomic {
       if
#ifndef BROKEN_DEFER
       :: j_up && !(am && j_boot != 0) ->
#else
       :: j_up ->
#endif
          flush(); j_started[r] = 1
       :: else -> goto next                               /* audit_unavailable */
       fi
     }
#endif
     /* spawn */
#ifndef BROKEN_IDENTITY
     exec_id = fd_id;                                     /* fexecve: the fd that was checked */
#else
     exec_id = bin_id;                                    /* the path, resolved again */
#endif
     atomic {
       assert(j_decided[r] == ALLOW);                     /* P5 */
       assert(!withdrawn[r]);                             /* P5: withdrawn never runs */
       assert(j_started[r] && j_claimed[r]);              /* P3 */
       assert(exec_id == approved_id[r] && exec_id == b); /* P1 */
       spawned[r]++;
       assert(spawned[r] <= 1)                            /* P5: at most once */
     }
#ifdef BROKEN_AUDIT
     atomic { flush(); j_started[r] = 1 };
#endif
next:
     /* forget the finished job: keeps the state space small */
     atomic { r = 0; t = 0; b = 0; am = 0; fd_id = 0; exec_id = 0; ok = 0 }
  od
}

/* The operator: approves or denies pending requests, holds and releases.
   A deny here also stands for the approval timeout, which has the same
   effect on every variable (the request ends DENY). */
proctype Operator() {
  byte r; byte t;
  byte brakes = 0;   /* one hold and one release, at any moment */
end_idle:
  do
  :: atomic {
       a_up && j_up && a_pending[0] -> r = 0;
       a_pending[r] = 0;
       if
       :: flush(); j_decided[r] = ALLOW; issue(r, 0)   /* table: allow */
       :: flush(); j_decided[r] = DENY; a_result[r] = DENY   /* table: deny timeout */
       fi;
       r = 0; t = 0
     }
  :: atomic {
       a_up && j_up && a_pending[1] -> r = 1;
       a_pending[r] = 0;
       if
       :: flush(); j_decided[r] = ALLOW; issue(r, 0)   /* table: allow */
       :: flush(); j_decided[r] = DENY; a_result[r] = DENY   /* table: deny timeout */
       fi;
       r = 0; t = 0
     }
  /* hold: in memory first, then durable (a failed journal write leaves it
     held in memory and the operator is told) */
  :: atomic { brakes < 1 && a_up && !a_hold -> a_hold = 1; brakes++ };
     atomic { if :: a_up && a_hold && j_up -> flush(); j_hold = 1 :: else -> skip fi }
  /* release: durable first, then memory */
  :: atomic { a_up && a_hold && j_up -> flush(); j_hold = 0 }; atomic { a_up -> a_hold = 0 }
  od
}

/* Crashes: approval and the journal each go down once and come back. */
proctype Crashes() {
  byte i;
  atomic {
    a_up = 0;
    a_hold = 0;
    i = 0;
    do
    :: i < T -> t_valid[i] = 0; t_early[i] = 0; i++
    :: i == T -> break
    od;
    /* pending requests end with approval_interrupted */
    if :: a_pending[0] -> a_pending[0] = 0; a_result[0] = DENY :: else -> skip fi;   /* table: interrupted */
    if :: a_pending[1] -> a_pending[1] = 0; a_result[1] = DENY :: else -> skip fi   /* table: interrupted */
  };
  atomic {
    a_up = 1;
#ifndef BROKEN_HOLD_MEMORY
    a_hold = j_hold                                       /* restored from the journal */
#endif
  };
  /* the journal: what was queued and not committed is lost; a new boot */
  atomic { j_up = 0; d_claimed[0] = 0; d_claimed[1] = 0; d_allowed[0] = 0; d_allowed[1] = 0 };
  atomic { j_boot = 1; j_up = 1 }
}

/* The agent swaps the binary at the approved path once, at any moment. */
proctype Swap() {
  bin_id = 1
}

#ifndef PERSONS
init {
  atomic {
    run Runner(); run Runner();
    run Operator(); run Crashes(); run Swap();
    run Intake(0); run Intake(1)
  }
}
#endif

#ifdef PERSONS
/* --- persons: one person, one vote (issue 27) ----------------------------------
 *
 * Person 0 is the requester: an operator who is also the agent that asked.
 * Every person may vote by uid (operator.sock) and with each of their keys
 * (a signature, on the operator door or carried by an agent: the same step
 * here).  A key belongs to one person (approval.signer_accounts); person 1
 * has two keys.  Each vote is checked (quorum.Tally.check), journaled (an
 * await: other votes may be counted meanwhile), then checked again and
 * counted (votes.py _count); the N-th counted vote issues the ticket.
 * Deny, the timeout and crashes are the main model's: a vote that is not
 * counted changes nothing here.
 */
#define P 3          /* persons (operator accounts); 0 is the requester */
#define K 4          /* keys */
#define N 2          /* the rule's approvals */
#define NOKEY 255

byte key_owner[K];   /* the person each key is mapped to */
byte counted;        /* votes counted so far */
byte vote_person[N]; /* the person of each counted vote */
byte vote_who[N];    /* what the tally compared for it */
byte vote_key[N];    /* its key (NOKEY for a vote by uid) */
bool issued;         /* the quorum was met: the ticket is issued */

/* Whether the vote (compared as w, key k) may count now: not after the
   ticket, never the requester, never a second vote of the same identity or
   the same key. */
inline admissible(w, k, ok) {
  ok = !issued && w != 0;
  i = 0;
  do
  :: i < counted ->
     if :: vote_who[i] == w || (k != NOKEY && vote_key[i] == k) -> ok = 0 :: else -> skip fi;
     i++
  :: else -> break
  od
}

/* A credential c votes: c < P is person c's uid, c >= P is key c - P. */
proctype Vote(byte c) {
  byte person; byte w; byte k; byte i; byte j; bool ok;
  atomic {
    if
    :: c < P -> person = c; k = NOKEY
    :: else -> person = key_owner[c - P]; k = c - P
    fi;
#ifndef BROKEN_KEYS
    w = person;                                  /* the person, however they voted */
#else
    w = c;                                       /* a uid and each key are voters of their own */
#endif
    admissible(w, k, ok)                         /* checked before the vote is journaled */
  };
  if :: !ok -> goto done :: else -> skip fi;
  /* the vote's operator.action is journaled: an await */
  atomic {
#ifndef BROKEN_RECHECK
    admissible(w, k, ok);                        /* checked again as it is counted */
#endif
    if
    :: ok && counted < N ->                      /* (the bound keeps a broken variant's arrays in range) */
       vote_person[counted] = person; vote_who[counted] = w; vote_key[counted] = k; counted++;
       if
       :: counted == N ->
          issued = 1;
          i = 0;
          do
          :: i < N ->
             assert(vote_person[i] != 0);        /* P6: the requester never counts */
             j = i + 1;
             do
             :: j < N -> assert(vote_person[i] != vote_person[j]); j++   /* P6: distinct persons */
             :: else -> break
             od;
             i++
          :: else -> break
          od
       :: else -> skip
       fi
    :: else -> skip
    fi
  };
done:
  skip
}

init {
  atomic {
    key_owner[0] = 0; key_owner[1] = 1; key_owner[2] = 1; key_owner[3] = 2;
    run Vote(0); run Vote(1); run Vote(2);                       /* by uid */
    run Vote(P + 0); run Vote(P + 1); run Vote(P + 2); run Vote(P + 3)   /* by key */
  }
}
#endif
