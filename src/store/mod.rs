//! The lock protocol: how leases are stored and changed in MongoDB.
//!
//! [`MongoStore`] is the only code in the crate that issues MongoDB commands,
//! and only the actor calls it, but for the reads and the operator's
//! overrides that need no lease state, which the manager sends it directly
//! (`inspect`, `list`, `force_release`, `request_release`, `release_owner`). The actor sees it through the narrow [`Store`]
//! trait, so its timing logic can also be tested under tokio's paused clock
//! against `memory::MemoryStore` (built for tests and for the simulator,
//! feature `sim`, hence not linked), an in-memory twin that follows the same
//! rules (used by those unit tests and by `crate::sim`, never as a stand-in
//! for MongoDB). The store contract (`tests::contract`, a test
//! module) runs one suite of scenarios against both, and the MongoDB
//! behaviour the protocol relies on is described in
//! `docs/mongodb-behaviour.md` (cited below by section).
//!
//! # Document schema
//!
//! One document per key in the lock collection:
//!
//! | field | type | meaning |
//! |---|---|---|
//! | `_id` | any BSON type MongoDB accepts as `_id` | the lease key ([`LeaseKey`](crate::LeaseKey)), exactly as given: a string, or e.g. the `ObjectId` of the locked document (docs/mongodb-behaviour.md, B10) |
//! | `aid` | string | owner id of the manager that holds (or last held) the lease |
//! | `lid` | UUID (binary subtype 4) | lease id of the current acquisition; absent once released |
//! | `tok` | int64 | fencing token of the current acquisition; `tok >> 20` is the server millisecond it was issued in, or later |
//! | `acq` | date | server time (`$$NOW`) of the current acquisition; kept by renewals and by a retry under the same lease id |
//! | `ts` | date | server time (`$$NOW`) of the last acquire or renewal |
//! | `exp` | date | server time at which the lease expires (`ts + ttl`, or the release time) |
//! | `data` | document, optional | payload set by the holder (`Lease::set_payload`, or by the acquiring write: `Acquire::payload`); absent after a new acquisition without one |
//! | `wt` | date, optional | server time at which another owner first waited for the current lease; removed by release and by a new acquisition |
//! | `yu` | date, optional | set by a release that another owner waited for: until then the releasing owner (`aid`) cannot take the key back |
//! | `hl` | date, optional | *hold until*: acquisition time + [`hold_at_least`](crate::Acquire::hold_at_least) (exclusive leases) |
//! | `hs` | array, optional | the holders of a shared or semaphore key, oldest first: `{aid, lid, tok, acq, ts, exp}` each (and `data`, a holder's payload; `n`, the permits a holder of several takes; an entry a release by owner id ended has `xl`, its lease id, instead of `lid`, until its expiry: see "Lock-delay") |
//! | `pm` | int32, optional | a semaphore key's number of permits, while it has holders in `hs` |
//! | `rl` | date, optional | server time of the last removal of a holder from `hs` (a release, a release by owner id, a force release): the write the change stream of releases announces |
//! | `xw` | document, optional | an exclusive waiter's mark on a shared key, `{aid, exp}`: no shared acquisition succeeds while `exp > $$NOW` |
//! | `q` | array, optional | the owners waiting for an exclusive key, in arrival order, at most [`MAX_QUEUE`] live: `{aid, lid, at, re, hx}` each, and `data`, the payload it acquires with, if any (see "Queue of waiting owners") |
//! | `tr` | int64, optional | leader transitions: how many acquisitions took the key from another owner since the document was created (see "Leader transitions") |
//! | `rv` | document, optional | a cooperative revocation: `{aid, at}`, the owner id that asked the holders to release the key and the server time it asked (see "Revocation"); removed by a new acquisition and a handoff |
//! | `nb` | date, optional | *not before*: the end of a lock-delay, written by a force release or a release by owner id of a live lease (see "Lock-delay"); removed by a new acquisition |
//! | `obtained_at` | date | `ts`, restated for other applications' clients (see "Read by other clients") |
//! | `ttl` | double | `exp − ts` in seconds, restated likewise: `obtained_at + ttl` seconds is `exp` |
//!
//! A document of this crate never has a `value` field: that is the owner
//! field of another lock pattern (`{_id, value, ttl, obtained_at}`), whose
//! clients take over an expired lock in place, writing `value`, `ttl` and
//! `obtained_at` and leaving the other fields (see "Read by other clients").
//!
//! **New documents and foreign ones.** Every write of this crate leaves a
//! document of its layout (an int64 `tok`, a date `exp` and no `value`) or none: an
//! acquisition writes the whole document, an attempt that does not win
//! writes nothing (docs/mongodb-behaviour.md, B2), a release keeps `tok`
//! and `exp`, and a delete removes the document. So any other document,
//! a bare `{_id}` included (a common lock by upsert: `$setOnInsert` of the
//! `_id` alone, released by a delete), is a lock held by a foreign holder:
//! owner id and expiry by the rules of its layout (`crate::foreign`: `ts` +
//! the TTL index on `ts`, `obtained_at + ttl`, `ExpireAt`, a user's rule;
//! otherwise owner id its `aid`, `""` without one, and no known expiry),
//! never modified while live by its rule, deleted only by a force release,
//! and taken over once expired by its rule: the acquire pipelines' first
//! stage turns it into what an inserting upsert sees, so the acquisition
//! writes a new document, its token by the token rule from no `tok`. An
//! upsert's pipeline sees a new
//! document as `{_id}` too, so the acquiring upserts filter on `{_id: key,
//! _ins: null}` (`_ins` is a field no lock document has): the upsert
//! copies that equality into the document it inserts, so the pipeline sees
//! `_ins: null` only in a document it is inserting (and two fields), while an
//! existing document (`_ins` missing, which `null` matches) is seen as it
//! is. The acquisition written leaves `_ins` out (docs/mongodb-behaviour.md,
//! B29).
//!
//! A lease is free when `exp <= $$NOW` on the server. A TTL index on `exp`
//! (`expireAfterSeconds` = the manager's GC grace) deletes released and
//! abandoned documents; takeover never waits for it. In delete-on-release
//! mode ([`ReleaseMode::Delete`](crate::ReleaseMode::Delete)) a release
//! deletes the document itself (see "Fencing tokens" for when).
//!
//! # Shared and semaphore keys
//!
//! A key held by shared holders or by permits of a semaphore
//! ([`LeaseKind`](crate::LeaseKind)) keeps its holders in one array, `hs`,
//! of the key's one document, so that every acquisition and release is
//! still one conditional write of one document. Its top-level fields then
//! describe the key: no `lid`; `aid`, `tok`, `acq` of the latest holder
//! acquisition; `ts` of the latest acquisition or renewal of any holder;
//! `exp` at least the latest `exp` of its holders. So the free rule of
//! exclusive leases (`exp <= $$NOW`) holds as it is (an exclusive
//! acquisition waits until every holder is gone or expired), the TTL index
//! on `exp` never deletes a key with a live holder, and the fencing-token
//! rule is the same counter: each holder gets `tok = max(tok + 1, ms($$NOW)
//! * 2^20)` and stores it in its entry and at the top.
//!
//! - A **shared** acquisition wins if the document is new, already holds
//!   this lease id (a retry), or has no live exclusive holder (no `lid`, or
//!   `exp <= $$NOW`), no live holder of a semaphore (`pm`), and no live
//!   exclusive waiter's mark of another owner (`xw.exp <= $$NOW` or `xw.aid`
//!   its own: a manager asks for a shared lease only when no exclusive
//!   waiter of its own is ahead, so its own mark is of a waiter that left).
//!   It drops the expired entries of `hs` and appends its own. A live
//!   exclusive holder (or a
//!   minimum hold, `hl`) makes it wait (held until that `exp`), a live mark
//!   likewise (held by the mark's `aid` until its `exp`); live permits are
//!   a [`KindMismatch`](crate::Error::KindMismatch).
//! - A **permit** of `n` taking `k` permits (1 by default; `k` is stored
//!   in its entry as `n` when above 1) wins if the document is new, a
//!   retry, or has no live exclusive holder and live entries in `hs` with
//!   `pm = n` whose permits (their `n`, or 1) add up to at most `n - k`
//!   (or none at all, which stores `pm = n`): all `k` or none, in the one
//!   conditional write. Live holders of another
//!   kind (shared holders, or a live exclusive holder or minimum hold), or
//!   `pm != n` with live holders, are a
//!   [`KindMismatch`](crate::Error::KindMismatch) (`AcquireOutcome::Mismatch`),
//!   nothing written; otherwise the key is held until its first live
//!   holder's `exp`.
//! - A retry under the same lease id and owner id (its entry still in `hs`)
//!   wins, whatever the other holders take, on a key still held as its
//!   kind (the same `pm`, or none for a shared one) or with no other live
//!   holder: it renews its entry, moved last, and gets its token back; the
//!   top `aid`, `acq` and `tr` stay those of the key's latest acquisition.
//!   On a key other live holders now hold as another kind (its number of
//!   permits changed since the entry was written) it writes nothing and is
//!   `AcquireOutcome::OursAsAnotherKind`: the actor gives the entry back.
//! - Between owners, a shared or permit acquisition follows "Fairness
//!   between owners" as an exclusive one does: it never takes a key its
//!   owner yielded before `yu`, and a waiting shared acquisition that finds
//!   another owner's live exclusive lease marks it (`wt`), so that its
//!   release yields.
//! - An **exclusive** acquisition on a key with live shared holders is
//!   held; a waiting attempt (re)writes `xw = {aid, exp: $$NOW + ttl}` and
//!   is told to retry before half its TTL has passed, so its mark stays live
//!   while it waits; its acquisition removes `hs`, `pm`, `xw` and `rl`. On
//!   live permits it is a [`KindMismatch`](crate::Error::KindMismatch).
//! - **Renewal** of holders in `hs` is part of the same one `updateMany` per
//!   batch: it matches a lease by `lid` at the top or in `hs` (with the
//!   owner id), and sets that entry's `ts` and `exp` and the top `ts` and
//!   `exp = max(exp, ...)`. (A batch with no holder that this store
//!   acquired sends the exclusive leases' renewal, with `exp` at least
//!   `hl`.)
//! - **Release** removes the entry (with the expired ones), sets `rl =
//!   $$NOW` (announced to other processes' waiters, whereas renewals are
//!   not), and moves the top `exp` to the latest remaining holder's `exp`,
//!   or to now if none remains (then `hs` and `pm` are removed; `tok` is
//!   kept). A batch mixing kinds is one update (one per round of distinct
//!   keys when it holds several leases of one key, so that the count is of
//!   leases). A release by owner id removes that owner's entries; a force
//!   release frees the whole key (`hs`, `pm`, `xw`, `hl` removed, `rl`
//!   set); the follow-up delete of delete mode never deletes a document
//!   with `hs` or a future `hl`. A holder's payload is its entry's `data`.
//!
//! # Holding at least
//!
//! An exclusive acquisition with `hold_at_least` stores `hl = $$NOW +
//! hold_at_least`, and `exp` never goes below `hl`: the acquisition sets
//! `exp = max($$NOW + ttl, hl)`, renewals likewise, and a release `exp =
//! max(min(exp, $$NOW), hl)`. So the free rule (`exp <= $$NOW`) keeps the
//! key until `hl` whatever happens to the holder, and the TTL index on
//! `exp` cannot delete the document before then. Only a force release (an
//! operator's override) frees it earlier. A new acquisition without
//! `hold_at_least` removes `hl`.
//!
//! # Lock-delay
//!
//! docs/lock-delay.md says what is delayed, what is not, and why. On the
//! wire: an involuntary end of a live lease (a force release, a release by
//! owner id) with a lock-delay `d` (the releasing manager's
//! [`lock_delay`](crate::LeaseManagerOptions::lock_delay)) writes, in the
//! releasing write, `nb = max($$NOW + d, exp)` ([`OverrideEnd::AtExpiry`],
//! the default: `exp` at least every live holder's and the minimum hold's)
//! or `nb = $$NOW + d` ([`OverrideEnd::Immediately`], which also shortens
//! the wait an earlier override left), and `exp = max(..., nb)`. So the
//! free rule keeps the key from everyone until `nb`; a shared or semaphore
//! acquisition, which does not wait for an `exp` without a holder (B3),
//! waits for `nb`; no handoff happens and no delete-mode delete (the
//! follow-up delete waits for `nb`) deletes before then. A release by
//! owner id delays a shared or semaphore key only when it removes all its
//! live holders; where others remain, and it waits for the holders, each
//! live entry it ends stays until its expiry with its lease id moved from
//! `lid` to `xl` (no write of that lease matches it, and an acquisition
//! under it landing late takes no place again); an immediate one removes
//! them. A new acquisition removes `nb`.
//!
//! # Revocation
//!
//! A request that the holders of a key release it (`rv = {aid, at:
//! $$NOW}`) is one update of a key held now, which changes no lease field:
//! the holders' managers see it in their change stream of writes and tell
//! their leases' followers. A new acquisition (which rewrites the
//! document) and a handoff remove it.
//!
//! # Fairness between owners
//!
//! Why (docs/protocol.md, "Fairness between processes"): a manager whose
//! tasks keep re-acquiring a key would otherwise keep it forever, its next
//! local waiter starting on the release's reply, a remote one only a
//! change-stream event (or a poll) later. So an attempt that will wait
//! marks the lease it found held by another owner (`wt`, once per holding
//! period; a `try_acquire` leaves no mark), and a release of a marked lease
//! *yields* the key: free for every other owner at once, and for the
//! releasing owner only after `yu`, the releasing manager's `retry_max`
//! (which bounds how long a polling waiter takes to retry). Which remote
//! owner gets it is decided by the queue below.
//!
//! In delete mode a release of a marked lease (insert-style clients never
//! mark) does not delete, since a deleted document cannot carry `yu`: it
//! yields as in keep mode; the waiter's own release deletes it, or the TTL
//! monitor if nobody takes it.
//!
//! # Queue of waiting owners
//!
//! An exclusive key also keeps the owners that wait for it, in arrival
//! order, in its document's array `q`: one entry per owner, `{aid, lid, at,
//! re, hx}` (the owner id, the lease id its next acquisition will carry,
//! when it first registered, when its registration expires, how long a
//! lease handed to it lasts unconfirmed) and `data`, the payload its
//! acquisition writes (`Acquire::payload`), if any. As in a fair lock
//! (Redisson's keeps such a queue with per-waiter timeouts), the key goes
//! to the first live waiter in the releasing write itself.
//!
//! - **Registration.** A waiting exclusive attempt (not a `try_acquire`)
//!   that loses because another owner holds the key, or is ahead in the
//!   queue, registers in its own write: its entry is refreshed in place
//!   (`lid`, `re`, `hx`, `data`; `at` and the position kept) when it names
//!   another lease id or payload or expires within `R / 2`, else left
//!   alone (no write, B2), or appended if it has none. `re = $$NOW + R`,
//!   `R` = [`registration_window`] `= 2 * retry_max + 1 s + safety_margin`
//!   of the registering manager (a live waiter tries at least every
//!   `retry_max`, so its entry never lapses; a dead one's lapses within
//!   `R`), and `hx = min(ttl, R)`, so that a handed lease, counted from
//!   the last registering attempt less the safety margin, still has time
//!   left when its manager learns of it. The attempt's `Held` reports the
//!   token it waits behind (a lease handed later exceeds it) and `ahead`,
//!   the other owners' live entries before its own (all of them if it has
//!   none): its manager reads a change stream for the key only while
//!   nobody is ahead of it or the key changes hands
//!   (`Attempt::Scheduled::far_behind` in the actor). Every write that
//!   rewrites `q` drops the entries with `re <= $$NOW`, and removes `q` once empty.
//! - **Bound.** At most [`MAX_QUEUE`] live entries: an owner with no entry
//!   appends one only while fewer are live (a refresh is not a new entry).
//!   Beyond the bound an attempt writes the rest as before (`wt`), answers
//!   `Held` with every live entry ahead (`StoreProfile::queue_bound`), and
//!   its owner keeps trying (one attempt per `retry_max`) with no change
//!   stream. Until it registers it is an owner that never registered (see
//!   "Order"); the owners beyond the bound race for the next free entry.
//!   A manager that believes itself registered without being so costs
//!   nothing: no handoff names it.
//! - **Handoff on release.** A release of an exclusive lease (also by owner
//!   id; not a force release) whose document has a live entry of another
//!   owner, and no minimum hold ahead (`hl`), makes the first such entry the
//!   holder in the same update: `aid`, `lid` and `data` from the entry, the
//!   next token by the token rule, `acq = ts = $$NOW`, `exp = $$NOW + hx`;
//!   the entry leaves `q`, and `wt`, `yu` and `hl` go. Otherwise the release
//!   is as before (yield included). The change stream announces it (it sets
//!   `lid`, `aid` and `tok`, B12, B24: [`KeyWrite::token`]) only to the new
//!   holder's streams ([`Announced::Waits`]). The new holder's manager,
//!   seeing its owner id and registered lease id, grants the lease on the
//!   event and renews it at once when it can tell how long it lasts (the
//!   event's token is greater than the one its last registering attempt
//!   found, and the handed lease, lasting at least `min(ttl, R)` from that
//!   attempt's send, has time before its local deadline); otherwise (no
//!   token, an old event, a deadline past, a minimum hold) it retries at
//!   once under the same lease id, which wins as a retry. Registration,
//!   release and that renewal are the handoff's three commands; without a
//!   change stream the next poll confirms it. A dead waiter holds a handed
//!   key at most `hx` after the handoff, and is handed it only while its
//!   registration is live.
//! - **Leaving.** A manager that shuts down leaves every queue it is in
//!   (`Store::leave_queues`: one `updateMany`); if an entry was gone (a
//!   handoff removes the entry it hands the key to), it then releases
//!   under each registered lease id whatever was handed to it (handing the
//!   key on). So only a crashed manager is left holding a key it did not
//!   confirm, for at most `hx`.
//! - **Order.** A free key (expired, or force released) with a live entry
//!   of another owner at the head of `q` is taken only by that owner (a
//!   retry aside); the others, and owners that never registered, wait and
//!   register behind it. The unit is the owner, not the task: a manager
//!   registers for its first local waiter and serves its own waiters first
//!   in, first out; the holder's manager does not register while it holds
//!   the key, so its next local waiters come after every owner registered
//!   at the release. An expiry is no handoff: the head takes the key at
//!   its next attempt. Shared and semaphore keys (which have the mark `xw`
//!   instead), in-document leases and foreign holders' locks have no queue.
//! - **Delete mode.** A document with a queue is never deleted by a
//!   release: it is handed over, or marked released, and deleted later by
//!   the follow-up delete once `q` is gone.
//!
//! # Handoff to a local waiter
//!
//! A release whose manager has a waiter for the key ([`Store::handoff`])
//! makes that waiter the holder in the releasing write itself, instead of a
//! release followed by the waiter's acquire (two serial round trips): one
//! `findOneAndUpdate` on `{_id, lid: from, aid: ours, tok: int64, exp >
//! $$NOW}` (the lease still held, by the server's clock), whose pipeline,
//! when no other owner waits (no `wt`, no live entry of another owner in
//! `q`) and no minimum hold is live (`hl <=
//! $$NOW` or none), makes it a new acquisition in place: `lid = to`, `tok =
//! max(tok + 1, ms($$NOW) * 2^20)` (the token rule: the new holder's token
//! is strictly greater), `acq = ts = $$NOW`, `exp = $$NOW + ttl`, and `data`,
//! `hl`, `wt` and `yu` removed (a new acquisition starts without them).
//! Otherwise it does exactly what a release does (`lid` and `wt` removed,
//! `exp = max(min(exp, $$NOW), hl)`, `yu` if another owner waited, and the
//! handoff to the first registered owner of "Queue of waiting owners"), so the
//! yield of "Fairness between owners" holds: a waiting owner elsewhere gets
//! the key before any local waiter. It returns `lid` and `tok`: `lid = to`
//! is the new acquisition, no `lid` a release, no document a lease no longer
//! held (lost, nothing written). An unknown outcome (a transient error) is
//! resolved by re-reading: `lid = to` is the acquisition, `lid = from` (the
//! write did not land) is tried again, anything else counts as released,
//! as for a release.
//!
//! Only plain leases of the lock collection are handed over (the
//! releasing lease and the waiter's); a shared or semaphore key, a waiter
//! with `hold_at_least` and in-document leases are released, and the
//! waiter acquires as usual. Other managers see no release: the change
//! event (a replacement, or an update) sets the new `lid` and removes none
//! (docs/mongodb-behaviour.md, B22), so it wakes none of their waiters (none
//! waits, or `wt` would be set), and observers see a new acquisition.
//! In delete mode a handoff keeps the document (only the yield path
//! releases, which keeps it too: `wt` is set), so tokens continue from it.
//!
//! # Light forms for keys nobody waits for
//!
//! The acquire, the release of one exclusive lease and the handoff above
//! each carry every case in one pipeline of over 400 expression nodes
//! (retries, the queue, waiting marks, holds, shared and semaphore keys),
//! which the server parses and evaluates at every write: more work than
//! the write itself (docs/mongodb-behaviour.md, B25). `MongoStore` first
//! sends a light form of each, one small stage, where its result is the
//! general form's:
//!
//! - **Acquire** (exclusive, no `hold_at_least`): the same upsert on `{_id,
//!   _ins: null}` (see "Document schema"), whose one `$replaceWith` writes the new acquisition (`aid`,
//!   `lid`, the next token, `acq = ts = $$NOW`, `exp = $$NOW + ttl`, nothing
//!   else) if the document is new, or of our layout, expired, with no `q`,
//!   `hs`, `pm` nor `xw`, not under this lease id and not yielded by this
//!   owner: the general "wins" narrowed, writing the same document.
//!   Otherwise it returns the document unchanged (no write), and the
//!   general acquire is sent. The reply is this write's acquisition only if
//!   its `ts` is the write's `$$NOW` (projected): a document that an
//!   earlier attempt under the same lease id left is renewed by the
//!   general form as a retry.
//! - **Release** of one exclusive lease: an `update` on `_id` alone whose
//!   one `$replaceWith` sets `exp = min(exp, $$NOW)` and removes `lid`,
//!   the general release's result, if the document holds this lease of
//!   this owner and has no `q`, `wt`, `hl`, `hs` nor `pm`; any other
//!   document is left unchanged. `nModified` 0: the general release
//!   follows and decides (a light write whose outcome was unknown counts as
//!   released, as above).
//! - **Handoff**: a `findAndModify` on `_id` alone whose `$replaceWith`
//!   writes that pipeline's acquisition branch if the document holds the
//!   live lease handed over (the conditions of "Handoff to a local
//!   waiter") and has no `q`, `wt`, `hl`, `hs` nor `pm`; the reply is the
//!   handoff only under the next lease id with `ts` the write's `$$NOW`.
//!   Otherwise it writes nothing (`HandoffOutcome::NotApplied`), and the
//!   actor sends the general handoff, which decides (released, or lost).
//!
//! The light release and handoff filter on `_id` alone, which the server
//! runs without query planning (B26; the acquire's `_ins: null` makes it a
//! planned query on the `_id` index, B29), and each light form names the lease ids as `let` variables, so
//! that a group's command encodes its update once. All three are
//! sent as raw commands, not retryable writes: the server then keeps no
//! image of a `findAndModify`'s result nor a transaction record for a
//! retry (B25), and an unknown outcome is resolved as every other (B7).
//! They need MongoDB 5.0 or later (`let`, `$unsetField`). The actor
//! picks the form: it remembers for 10 s a key the general form was sent
//! for, or a light form did not apply to
//! (`config::CONTENDED_FOR`, `actor::group_commit`), and sends its
//! writes to the general form at once meanwhile: a contended key costs no
//! extra round trip. The twin has one form of the handoff, and the light
//! acquire and release as below (`memory::light`; the store contract
//! checks the results), and the light forms' equivalence is
//! checked on a real server (`store::mongo::tests::light`).
//!
//! **Grouped.** A light acquire or release asked for while another of its
//! form is in flight waits for it in the actor, and those that waited go
//! together, in one store call and one command (B27: most of a small
//! write's cost is per command). One asked for while none is in flight
//! goes at once, alone, in the form above. A group of acquires is one
//! `update` of one upsert statement per key and one `find` of the keys; a
//! group of releases is one `update` of one statement per lease, and a
//! `find` of the keys unless every statement applied. Which requests count
//! as done is decided from those replies by `light_acquire` and
//! `light_release` (their module docs give the decision and why it is
//! safe), shared with the twin so that the simulation covers it; anything
//! else goes to the general form, which decides as for a single write.
//! Only string keys are grouped (the `find`'s documents are matched to the
//! requests by `_id`). The group commit is the actor's
//! (`actor::group_commit`).
//!
//! # Leader transitions
//!
//! `tr` counts the changes of owner of a key, as the Kubernetes Lease's
//! `leaseTransitions`: every write that makes a new acquisition (the
//! general and light acquires of every kind, the handoff to a registered
//! owner) sets `tr = 0` on a document it inserts, `tr + 1` if the key's
//! last acquisition (`aid`) was another owner's, `tr` otherwise (a missing
//! `tr` counts as 0); every other write keeps it. So a lease taken again by
//! the same owner (a retry, a handoff to a local waiter, a re-acquisition
//! after its own release or expiry) is no transition, and a document
//! deleted (by the TTL index on `exp`, or a release in delete mode) starts
//! again from 0. The fencing token cannot stand in for it: it grows with
//! every acquisition, the same owner's included, and by the server's time.
//!
//! # Fencing tokens
//!
//! `tok = max(previous tok + 1, ms($$NOW) * 2^20)`: docs/protocol.md,
//! "Fencing tokens", says why tokens only grow, across expiry takeovers and
//! deletes, and what it assumes. `$$NOW` alone is not a fence: concurrent
//! writes to one document can observe it going backwards by a few
//! milliseconds (docs/mongodb-behaviour.md, B3).
//!
//! **Delete-on-release mode.** A release deletes (`deleteOne` for one
//! lease, a retryable write; `deleteMany` for a batch) only documents whose
//! token is old enough by the server's clock: `ms($$NOW) * 2^20 >= tok + D
//! * 2^20` in the delete's `$expr`, `D = DELETE_MIN_TOKEN_AGE` (1 s). The
//! younger leases of the release are marked released as in keep mode in a
//! second command, and the manager deletes them once `D` (plus 100 ms) has
//! passed since their acquisition, with a delete matching only released,
//! not yielded documents of our layout, old enough by the same rule (a new
//! acquisition in between sets `lid` and is never deleted). The release of
//! one lease acquired less than `D` plus 100 ms ago by the manager's clock
//! skips the delete that could not match and only marks it released
//! (`Release::LeaseTooYoungToDelete`); the follow-up deletes it.
//!
//! # Late writes
//!
//! A write may land at any time after it was sent, whether or not the
//! manager still waits for it (no write carries `maxTimeMS`); every write is
//! harmless whenever it lands (docs/safety.md, "Late writes and client-side
//! timeouts", has the argument and where the crate stops waiting):
//!
//! - every write of a lease is conditional on its lease id (and owner id),
//!   which a release, a handoff and a takeover remove or replace;
//! - under one lease id `exp` never moves back: a renewal, a TTL change
//!   and a retry of the acquisition write `exp = max(exp, $$NOW + ttl)` (a
//!   holder's entry of `hs` likewise), so the local deadline each confirmed
//!   write gives holds however late the others land;
//! - a late acquisition of a key freed meanwhile holds it for a lease id
//!   nobody holds until its TTL passes: time, never safety;
//! - releases, handoffs and overrides decide from the document as it is
//!   when they land.
//!
//! Not covered: a payload write and a write under an in-document lease,
//! which may land after a later one of the same lease; no lease property
//! depends on them.
//!
//! # Garbage collection
//!
//! A TTL index on `exp` (`expireAfterSeconds` the GC grace, at least
//! `DELETE_MIN_TOKEN_AGE`) deletes released and abandoned documents of
//! ours. It is partial ([`gc_filter`]: documents without `value`), so it
//! never deletes the lock of the `{_id, value, ttl, obtained_at}`
//! pattern's client that took a document of ours over in place, which
//! keeps our `exp` beside its `value` ("Read by other clients").
//! `connect` replaces a TTL index on `exp` that covers every document.
//!
//! # Read by other clients
//!
//! The `{_id, value, ttl, obtained_at}` pattern's clients (`crate::foreign`)
//! read a lock as held until `obtained_at + ttl` seconds, then take it over
//! in place, writing `value`, `ttl` and `obtained_at` and leaving the other
//! fields (B31). docs/sharing.md, "Our leases as their clients read them",
//! says what each pattern's client sees and why it holds. Here:
//!
//! - every write that may change `ts` or `exp` restates `obtained_at = ts`
//!   and `ttl` (seconds) from `max(exp, ms(tok >> 20) + D + 1 ms)` on a
//!   document of our shape: by one last stage (`mongo::rules::restated`),
//!   or in the write's own stages (light acquire, light release, renewals);
//! - a document with `value` is that pattern's lock (`store::is_our_layout`),
//!   even if it still carries our fields, and every write conditional on a
//!   lease id also requires no `value`, so a late write of the lease it was
//!   matches nothing;
//! - `connect` chooses delete-on-release mode in a collection it finds
//!   shared (`mongo::prepare`, `CollectionFacts::shared`) unless the user
//!   set `LeaseManagerOptions::release_mode`: for the `{_id, ts, aid}` and
//!   `{_id, ExpireAt}` patterns a released key is free only once its
//!   document is gone.

mod mongo;

#[cfg(any(test, feature = "sim"))]
pub(crate) mod memory;

mod handoff;
pub(crate) mod light_acquire;
pub(crate) mod light_release;
mod profile;
mod protocol;
mod read;
mod release;
pub(crate) mod replies;
#[cfg(all(test, feature = "testkit"))]
mod tests;

use std::time::Duration;

use uuid::Uuid;

use crate::key::LeaseKey;

pub(crate) use handoff::{Handoff, HandoffOutcome};
pub(crate) use mongo::MongoStore;
pub(crate) use mongo::{LeaseCheck, run_fenced};
pub(crate) use profile::StoreProfile;
pub(crate) use protocol::Store;
#[cfg(test)]
pub(crate) use protocol::tests::StoreExt;
pub(crate) use read::{FIELD_COUNT, foreign_owner, is_our_layout, lease_info};
pub(crate) use release::{Release, Released};

/// Field names of the lock document.
pub(crate) mod field {
    pub const ID: &str = "_id";
    pub const OWNER: &str = "aid";
    pub const LEASE_ID: &str = "lid";
    pub const TOKEN: &str = "tok";
    pub const RENEWED_AT: &str = "ts";
    pub const EXPIRES_AT: &str = "exp";
    pub const ACQUIRED_AT: &str = "acq";
    pub const PAYLOAD: &str = "data";
    pub const WAITING_SINCE: &str = "wt";
    pub const YIELD_UNTIL: &str = "yu";
    pub const HOLD_UNTIL: &str = "hl";
    pub const HOLDERS: &str = "hs";
    pub const PERMITS: &str = "pm";
    pub const RELEASED_AT: &str = "rl";
    pub const EXCLUSIVE_WAITER: &str = "xw";
    pub const QUEUE: &str = "q";
    /// How many times the key went to another owner (see "Leader
    /// transitions").
    pub const TRANSITIONS: &str = "tr";
    /// A cooperative revocation's request, `{aid, at}` (see "Revocation").
    pub const REVOCATION: &str = "rv";
    /// *Not before*: the end of a lock-delay (see "Lock-delay").
    pub const NOT_BEFORE: &str = "nb";
    /// Only in an acquiring upsert's filter (`{_id, _ins: null}`), hence in
    /// the document it inserts, which its pipeline rewrites without it: what
    /// tells a new document from an existing bare `{_id}` (see "Document
    /// schema").
    pub const INSERTED: &str = "_ins";
    /// `ts` restated for another lock pattern's clients ("Read by other
    /// clients").
    pub const OBTAINED_AT: &str = "obtained_at";
    /// `exp − ts` in seconds, restated likewise.
    pub const TTL_SECONDS: &str = "ttl";
    /// Another lock pattern's owner field: never in a document of ours, so
    /// a document that has it is another application's lock (that
    /// pattern's takeover of an expired lease of ours writes it).
    pub const OTHER_OWNER: &str = "value";
    /// An entry of `hs` of a semaphore key: how many permits it takes (1
    /// when absent).
    pub const PERMITS_TAKEN: &str = "n";
    /// An entry of `hs` that an operator's release by owner id ended and
    /// keeps until its expiry: its lease id, moved out of `lid` (no write of
    /// the lease matches it, and an acquisition under it, landing late, does
    /// not take a place again; see "Lock-delay").
    pub const ENDED_LEASE_ID: &str = "xl";
    /// An entry of `q`: when its owner first registered.
    pub const REGISTERED_AT: &str = "at";
    /// An entry of `q`: when its registration expires.
    pub const REGISTRATION_EXPIRES: &str = "re";
    /// An entry of `q`: how long (ms) a lease handed to it lasts unconfirmed.
    pub const HANDED_TTL: &str = "hx";
}

/// Added to twice a manager's `retry_max` in [`registration_window`]: the
/// round trip of the registering attempt itself, with room for a loaded
/// server (B6-style latencies of tens of milliseconds, far below it).
pub(crate) const REGISTRATION_SLACK: Duration = Duration::from_secs(1);

/// How long a waiting owner's registration in the queue of a key lasts
/// (`R` of "Queue of waiting owners", which says why each term):
/// `2 * retry_max +` [`REGISTRATION_SLACK`] `+ safety_margin`
/// (saturating), the registering manager's. The margin is in `R` because
/// a handed lease's local deadline, counted from the last registering
/// attempt, is less the margin: without it the default settings would
/// leave no time at all.
pub(crate) fn registration_window(retry_max: Duration, safety_margin: Duration) -> Duration {
    retry_max
        .saturating_mul(2)
        .saturating_add(REGISTRATION_SLACK)
        .saturating_add(safety_margin)
}

/// The most live entries the queue of waiting owners of a key (`q`) holds
/// ("Bound" in "Queue of waiting owners"). An entry without a payload is
/// about 117 bytes of BSON (`aid` a 36-byte UUID string 46, `lid` 26,
/// `at`, `re` and `hx` 12 each, overhead 9): about 7.5 KB that every write
/// of the key rewrites (docs/performance.md, "The queue in the document",
/// says why 64 and not 16).
pub(crate) const MAX_QUEUE: usize = 64;

/// How long the server holds a `getMore` of the stream of writes that has
/// nothing to announce before it answers with an empty batch (the
/// server's default is 1 s): an idle stream costs one command per 10 s
/// (docs/mongodb-behaviour.md, B33). The twin's streams wake as often
/// (`MemoryDb::release_readers`).
pub(crate) const RELEASE_EVENTS_AWAIT: Duration = Duration::from_secs(10);

/// In delete mode, how long after a young lease's acquisition (local time
/// at which its acquire's reply arrived, no earlier than the token's
/// millisecond) its released document is deleted:
/// [`DELETE_MIN_TOKEN_AGE`](crate::DELETE_MIN_TOKEN_AGE) plus 100 ms for the
/// server's `$$NOW` stepping back (docs/mongodb-behaviour.md, B3) and the
/// round trip of the release.
pub(crate) const DELETE_DELAY: Duration =
    Duration::from_millis(crate::config::DELETE_MIN_TOKEN_AGE.as_millis() as u64 + 100);

/// The partial filter of the garbage-collection TTL index on `exp`:
/// documents without `value` (`{value: null}` matches a missing field),
/// so that another application's lock that took a lease document of ours
/// over in place, keeping our `exp` beside its `value`, is never deleted
/// by our index ("Garbage collection").
pub(crate) fn gc_filter() -> mongodb::bson::Document {
    mongodb::bson::doc! { field::OTHER_OWNER: mongodb::bson::Bson::Null }
}

/// When an operator's override (a force release, a release by owner id)
/// lets the key of a live lease it ends be granted again ("Lock-delay").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum OverrideEnd {
    /// Not before the lease's expiry (`exp`), nor before the lock-delay:
    /// its holder has stopped by then, whether it was told or not.
    #[default]
    AtExpiry,
    /// After the lock-delay alone: the operator knows the holder is gone.
    Immediately,
}

/// The key and lease id that identify one acquisition, and its kind: the
/// store picks the form of a renewal or a release by it (the plain
/// exclusive renewal, the light release), holding no memory of its own of
/// which leases are holders of shared or semaphore keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct LeaseRef {
    pub key: LeaseKey,
    pub lease_id: Uuid,
    pub kind: crate::kind::LeaseKind,
}

/// A write to a lock document, as the announcement stream
/// ([`Store::watch_releases`]) reports it: what the write left in the
/// document, as far as the event shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyWrite {
    /// The key (`_id`) of the document written.
    pub key: LeaseKey,
    /// The write may have freed the key: a delete, a release (`lid` removed),
    /// a replacement without a lease id, or the release of a holder of a
    /// shared or semaphore key (`rl` set). Wakes the key's local waiters.
    pub freed: bool,
    /// The `lid` the write set, if the event shows one (`None` also for a
    /// `lid` that is not a UUID).
    pub lease_id: Option<Uuid>,
    /// The `aid` the write set, if the event shows one.
    pub owner: Option<String>,
    /// The `tok` the write set, if the event shows one (an int64, or an
    /// int32; `None` for a negative value or another type, a delete, and
    /// the release of a holder of a shared or semaphore key). With
    /// [`KeyWrite::keeps`], the token of the lease the write made.
    pub token: Option<u64>,
}

impl KeyWrite {
    /// Whether the event shows the document still carrying lease `lease_id`
    /// of `owner`: the write set that lease id (only an acquisition under it
    /// writes it) and, if it set an owner id, set `owner`. Any other write
    /// to a held key (a delete, a release, another `lid` or `aid`) may have
    /// taken the lease away, which only the store can tell: the event may be
    /// stale (docs/mongodb-behaviour.md, B12).
    pub fn keeps(&self, lease_id: Uuid, owner: &str) -> bool {
        !self.freed
            && self.lease_id == Some(lease_id)
            && self.owner.as_deref().is_none_or(|o| o == owner)
    }
}

/// Which writes a stream of writes ([`Store::watch_releases`]) announces:
/// with [`Announced::Waits`] a queue's handoff is announced to its new
/// owner alone, not to every owner waiting for the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Announced {
    /// Every write that may change who holds a key: also another owner's
    /// acquisition or handoff, which may take a held lease away
    /// (`LeaseManagerOptions::watch_held_leases`).
    Writes,
    /// What a waiter needs: writes that may free a key, writes that make
    /// this owner the holder (`aid` set to it: a handoff to it), and
    /// requests for revocation.
    Waits,
}

impl Announcement {
    /// Whether a stream of `announced` opened by `owner` carries this
    /// announcement. The twin filters its announcements with this; a
    /// change stream's `$match` selects the same writes on the server
    /// (`store::mongo::watch`), as the store contract checks.
    #[cfg(any(test, feature = "sim"))]
    pub fn is_announced(&self, announced: Announced, owner: &str) -> bool {
        match (self, announced) {
            (Announcement::Write(write), Announced::Waits) => {
                write.freed || write.owner.as_deref() == Some(owner)
            }
            _ => true,
        }
    }
}

/// An item of the announcement stream ([`Store::watch_releases`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Announcement {
    /// The stream is open: every write from now on is announced, none
    /// before. Comes first, once.
    Opened,
    /// A write that may change who holds a key.
    Write(KeyWrite),
    /// A request that the holders of `key` release it, by owner id `by`
    /// ("Revocation").
    RevocationRequested { key: LeaseKey, by: String },
}

/// Where the locks of one store live (a place, ARCHITECTURE.md's
/// glossary). Leases carry it, so that the transaction helper can name the
/// lock in the caller's session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockPlace {
    /// The database of the collection.
    pub database: String,
    /// The collection.
    pub collection: String,
    /// The field of the user's document that holds the lock fields (`aid`,
    /// `lid`, `tok`, `acq`, `ts`, `exp`, `wt`, `yu`) for in-document leases;
    /// `None` for the lock collection, whose documents hold them at the top.
    pub field: Option<String>,
    /// The top-level field that also holds the lease id of in-document
    /// leases kept for other clients (`LockIdFields::lock_id`): a check of
    /// the lease requires it to hold the lease id too.
    pub lock_id: Option<String>,
}

impl LockPlace {
    /// The path of lock field `name` (one of [`field`]) in a document of
    /// this place: `name` itself in the lock collection, `<field>.<name>` in
    /// a user's document.
    pub fn path(&self, name: &str) -> String {
        match &self.field {
            None => name.to_string(),
            Some(prefix) => format!("{prefix}.{name}"),
        }
    }

    /// `database.collection`, as errors name it.
    pub fn namespace(&self) -> String {
        format!("{}.{}", self.database, self.collection)
    }
}

/// A write under an in-document lease ([`Store::write_document`]).
#[derive(Debug, Clone)]
pub(crate) struct DocumentWrite {
    /// The user's update (checked: it never names the lock field).
    pub update: crate::document_update::DocumentUpdate,
    /// Release the lease in the same write (`commit`), as the release in
    /// two writes of in-document leases does (the lock field removed when
    /// old enough and not waited for, else left released for the
    /// follow-up, [`Release::ReleasedDocuments`]).
    pub release: bool,
    /// The lease was acquired less than [`DELETE_DELAY`] ago by the local
    /// clock (set by the actor): its token is too young for the lock field
    /// to be removed, so a release by update operators skips that attempt
    /// (one round trip less). Only a hint: the server's clock decides.
    pub too_young_to_delete: bool,
}

/// One acquire attempt of the general form ([`Store::acquire`]), as the
/// actor sends it.
#[derive(Debug, Clone)]
pub(crate) struct AcquireRequest {
    pub key: LeaseKey,
    /// Kept across the attempt's retries, so that a retry is recognised.
    pub lease_id: Uuid,
    /// The caller will retry until it gets the key, so a lease held by
    /// another owner is marked as waited for (see "Fairness between owners").
    pub waiting: bool,
    /// The acquisition expires this long after the server's now.
    pub ttl: Duration,
    /// The kind and minimum hold asked for.
    pub shape: crate::kind::LeaseShape,
    /// In-document leases: the fields to create a missing document with
    /// (`None`: a missing document is
    /// [`Error::DocumentNotFound`](crate::Error::DocumentNotFound)).
    pub create: Option<mongodb::bson::Document>,
    /// Exclusive leases of the lock collection: the payload (`data`) the
    /// acquiring write sets, a retry under the same lease id included
    /// (`None`: a new acquisition drops `data`, a retry keeps it).
    pub payload: Option<mongodb::bson::Document>,
}

/// A payload with the acquisition is written by the general acquire of an
/// exclusive lease of the lock collection only: refused elsewhere, before
/// anything is sent, by both stores.
pub(crate) fn payload_applies(
    in_documents: bool,
    shape: crate::kind::LeaseShape,
    payload: Option<&mongodb::bson::Document>,
) -> crate::error::Result<()> {
    if payload.is_none() || (!in_documents && shape.kind == crate::kind::LeaseKind::Exclusive) {
        return Ok(());
    }
    Err(crate::error::Error::Unsupported {
        reason: "a payload with the acquisition applies to exclusive leases of the lock \
                 collection only"
            .into(),
    })
}

/// In-document leases are plain leases: any other shape (a
/// shared lease, a permit, a minimum hold) is refused before anything is
/// sent, by both stores.
pub(crate) fn document_shape(shape: crate::kind::LeaseShape) -> crate::error::Result<()> {
    if shape.is_plain() {
        return Ok(());
    }
    Err(crate::error::Error::Unsupported {
        reason: format!(
            "in-document leases are exclusive, without hold_at_least (asked: {shape:?})"
        ),
    })
}

/// What an acquire attempt found, derived by the functions of [`replies`]
/// from the attempt's own write or from a read afterwards (what each
/// proves: [`replies`]' module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireOutcome {
    /// The lease is ours, with this fencing token: the attempt's own write
    /// returned it, so it lasts the attempt's TTL from a server time after
    /// the attempt was sent.
    Acquired { token: u64 },
    /// This attempt's lease (its owner id and lease id) is on the key, but
    /// only a read says so, or it has expired: its expiry is unknown, so it
    /// is not granted, and the actor retries at once under the same lease
    /// id ([`replies`]' module docs). `token` is the one found. Registers
    /// nothing for grant on the event.
    Unconfirmed { token: u64 },
    /// The key is held as another kind than the one asked for (see
    /// "Shared and semaphore keys"); the attempt's own write says so, and
    /// wrote nothing.
    Mismatch { stored: crate::kind::LeaseKind },
    /// This attempt's lease id has an entry on the key (an earlier attempt
    /// under it landed unseen), but the key is now held as `stored` by
    /// other live holders: its number of permits changed since
    /// (`Store::set_permits`). The write renewed nothing. The actor gives
    /// the entry back and answers as for a [`Mismatch`](Self::Mismatch);
    /// renewed, the entry would count as a permit of the old number on a
    /// key of the new one.
    OursAsAnotherKind { stored: crate::kind::LeaseKind },
    /// Another acquisition holds the key for at most `remaining` more
    /// (server time). For a foreign holder (a document not of our layout,
    /// never modified by an acquire while live), the time left until its
    /// expiry by its own rule (`crate::foreign`), or `None` if it has none:
    /// it is free once its owner (or a TTL index) deletes it.
    Held {
        holder: String,
        remaining: Option<Duration>,
        /// The fencing token (`tok`) stored on the key when the attempt
        /// read it (for a shared or semaphore key, the top `tok`), which a
        /// lease handed later exceeds ("Queue of waiting owners"). `None`
        /// when the document has none (a foreign holder's lock, a lock
        /// field removed meanwhile), and for an answer from a read
        /// ([`replies::from_reread`]).
        token: Option<u64>,
        /// How many other owners' live registrations are ahead of this
        /// owner's in the key's queue of waiting owners (all of them if it
        /// has none; "Queue of waiting owners"): 0 also when the key has no
        /// queue and when the answer does not tell (a read, a foreign
        /// holder's lock, a shared or semaphore key, an in-document lease).
        ahead: u32,
    },
}
