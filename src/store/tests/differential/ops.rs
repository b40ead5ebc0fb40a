//! The steps: what a step does ([`Op`]), how a seed draws it ([`Gen`], one
//! function per kind of operation), and how it is applied to both sides at
//! once ([`apply`]), each answer in the normal form.

use std::time::Duration;

use mongodb::bson::{Document, doc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;
use uuid::Uuid;

use super::deadlines::Class;
use super::norm::{Reply, V};
use super::world::{
    self, HOLDS, OWNERS, P1_AGE, P2_TTLS, P2_VALUES, P3_LIFETIMES, TTL, TTLS, World,
};
use crate::key::LeaseKey;
use crate::kind::LeaseKind;
use crate::kind::LeaseShape;
use crate::store::StoreExt;
use crate::store::light_acquire::LightAcquire;
use crate::store::{AcquireRequest, LeaseRef, OverrideEnd, Store};

/// One step, as drawn: its store calls (by owner index) or the other
/// applications' commands.
#[derive(Debug, Clone)]
pub(super) enum Op {
    /// The general acquire (any kind, minimum hold, payload, waiting or
    /// not); `retry`: under a lease id used before.
    Acquire {
        owner: usize,
        key: LeaseKey,
        lease_id: Uuid,
        retry: bool,
        waiting: bool,
        ttl: Duration,
        shape: LeaseShape,
        payload: Option<Document>,
    },
    /// The light acquire, alone (one request) or grouped.
    LightAcquire {
        owner: usize,
        requests: Vec<(LeaseKey, Uuid, Duration)>,
    },
    Renew {
        owner: usize,
        leases: Vec<LeaseRef>,
        ttl: Duration,
    },
    Release {
        owner: usize,
        leases: Vec<LeaseRef>,
    },
    /// The light release, alone (one lease) or grouped.
    LightRelease {
        owner: usize,
        leases: Vec<LeaseRef>,
        hands_over: bool,
    },
    ReleaseTooYoungToDelete {
        owner: usize,
        lease: LeaseRef,
    },
    ReleaseOwner {
        operator: usize,
        owner: String,
        end: OverrideEnd,
    },
    ForceRelease {
        operator: usize,
        key: LeaseKey,
        end: OverrideEnd,
    },
    DeleteReleased {
        owner: usize,
        keys: Vec<LeaseKey>,
    },
    Handoff {
        owner: usize,
        key: LeaseKey,
        from: Uuid,
        to: Uuid,
        ttl: Duration,
        light: bool,
    },
    SetPayload {
        owner: usize,
        lease: LeaseRef,
        payload: Document,
    },
    SetPermits {
        owner: usize,
        key: LeaseKey,
        permits: u32,
    },
    RequestRelease {
        owner: usize,
        key: LeaseKey,
    },
    Revocations {
        owner: usize,
        keys: Vec<LeaseKey>,
    },
    LeaveQueues {
        owner: usize,
        keys: Vec<LeaseKey>,
    },
    Inspect {
        owner: usize,
        key: LeaseKey,
    },
    List {
        owner: usize,
        after: Option<LeaseKey>,
        limit: usize,
    },
    /// Another application's command.
    Foreign(Foreign),
    /// The TTL monitor's pass.
    TtlPass,
    /// Time passes (past the next deadline, when one is near).
    Sleep(Duration),
}

/// Another application's command on the lock collection.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Foreign {
    /// Pattern 1's insert, `ts` aged past its TTL index or not.
    P1Lock {
        key: LeaseKey,
        aged: bool,
    },
    /// Pattern 1's release by `_id`.
    P1ReleaseById {
        key: LeaseKey,
    },
    /// Pattern 1's release by `aid`.
    P1ReleaseByAid,
    P2Lock {
        key: LeaseKey,
        value: &'static str,
        ttl: i32,
    },
    P2Unlock {
        key: LeaseKey,
        value: &'static str,
    },
    P3Lock {
        key: LeaseKey,
        lifetime: Duration,
    },
    P3Unlock {
        key: LeaseKey,
    },
    BareLock {
        key: LeaseKey,
    },
    BareUnlock {
        key: LeaseKey,
    },
    /// The `{_id, locked, owner, created, expire}` client's lock, expiring
    /// after `life` or never (`Schema::Locked`, declared by its rule).
    SchemaLock {
        key: LeaseKey,
        life: Option<Duration>,
    },
    SchemaUnlock {
        key: LeaseKey,
    },
}

impl Op {
    /// The kind of operation, for the summary and the known divergences.
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Acquire { retry: true, .. } => "acquire (retry)",
            Op::Acquire { .. } => "acquire",
            Op::LightAcquire { requests, .. } if requests.len() == 1 => "light acquire",
            Op::LightAcquire { .. } => "grouped light acquire",
            Op::Renew { .. } => "renew",
            Op::Release { .. } => "release",
            Op::LightRelease { leases, .. } if leases.len() == 1 => "light release",
            Op::LightRelease { .. } => "grouped light release",
            Op::ReleaseTooYoungToDelete { .. } => "release too young to delete",
            Op::ReleaseOwner { .. } => "release owner",
            Op::ForceRelease { .. } => "force release",
            Op::DeleteReleased { .. } => "delete released",
            Op::Handoff { .. } => "handoff",
            Op::SetPayload { .. } => "set payload",
            Op::SetPermits { .. } => "set permits",
            Op::RequestRelease { .. } => "request release",
            Op::Revocations { .. } => "revocations",
            Op::LeaveQueues { .. } => "leave queues",
            Op::Inspect { .. } => "inspect",
            Op::List { .. } => "list",
            Op::Foreign(Foreign::P1Lock { .. }) => "pattern 1 lock",
            Op::Foreign(Foreign::P1ReleaseById { .. }) => "pattern 1 release by _id",
            Op::Foreign(Foreign::P1ReleaseByAid) => "pattern 1 release by aid",
            Op::Foreign(Foreign::P2Lock { .. }) => "pattern 2 lock",
            Op::Foreign(Foreign::P2Unlock { .. }) => "pattern 2 unlock",
            Op::Foreign(Foreign::P3Lock { .. }) => "pattern 3 lock",
            Op::Foreign(Foreign::P3Unlock { .. }) => "pattern 3 unlock",
            Op::Foreign(Foreign::BareLock { .. }) => "bare lock",
            Op::Foreign(Foreign::BareUnlock { .. }) => "bare unlock",
            Op::Foreign(Foreign::SchemaLock { .. }) => "schema lock",
            Op::Foreign(Foreign::SchemaUnlock { .. }) => "schema unlock",
            Op::TtlPass => "TTL pass",
            Op::Sleep(_) => "sleep",
        }
    }

    /// How long the step may take (ms): no deadline may fall in it.
    pub fn budget(&self) -> i64 {
        match self {
            // Delete mode's follow-up after `DELETE_DELAY`.
            Op::ReleaseOwner { .. } => 1_300,
            _ => 40,
        }
    }

    /// Whether the step may write: anything but the reads and the sleeps.
    pub fn writes(&self) -> bool {
        !matches!(
            self,
            Op::Inspect { .. } | Op::List { .. } | Op::Revocations { .. } | Op::Sleep(_)
        )
    }

    /// Whether deadlines of `class` matter to this step (`delete_mode`: of
    /// an owner's store).
    pub fn cares(&self, class: Class, delete_mode: impl Fn(usize) -> bool) -> bool {
        match class {
            Class::Expiry => true,
            Class::TokenAge => match self {
                Op::Release { owner, .. }
                | Op::ReleaseTooYoungToDelete { owner, .. }
                | Op::DeleteReleased { owner, .. }
                | Op::Handoff { owner, .. } => delete_mode(*owner),
                Op::ReleaseOwner { operator, .. } => delete_mode(*operator),
                _ => false,
            },
            Class::Retry => matches!(self, Op::Acquire { .. }),
            Class::Refresh => matches!(self, Op::Acquire { waiting: true, .. }),
        }
    }
}

/// A lease id a seed used, with what it was acquired as.
#[derive(Debug, Clone)]
struct Used {
    owner: usize,
    key: LeaseKey,
    id: Uuid,
    shape: LeaseShape,
}

impl Used {
    fn lease(&self) -> LeaseRef {
        LeaseRef {
            key: self.key.clone(),
            lease_id: self.id,
            kind: self.shape.kind,
        }
    }
}

/// One kind of operation's drawing function: `None` if it has nothing to
/// draw from now.
type Draw = fn(&mut Gen, &World) -> Option<Op>;

/// A seed's generator: its random numbers, the lease ids it used, and the
/// other applications' locks it believes held.
pub(super) struct Gen {
    rng: StdRng,
    used: Vec<Used>,
    foreign: Vec<Foreign>,
    payloads: i32,
}

impl Gen {
    pub fn new(seed: u64) -> Gen {
        Gen {
            rng: StdRng::seed_from_u64(seed),
            used: Vec::new(),
            foreign: Vec::new(),
            payloads: 0,
        }
    }

    /// The next step; `next_deadline`: how long until the earliest
    /// deadline is surely past, if any.
    pub fn draw(&mut self, world: &World, next_deadline: Option<Duration>) -> Op {
        let weights: [(u32, Draw); 19] = [
            (24, Gen::acquire),
            (7, Gen::light_acquire),
            (9, Gen::renew),
            (7, Gen::release),
            (5, Gen::light_release),
            (2, Gen::release_too_young_to_delete),
            (3, Gen::release_owner),
            (3, Gen::force_release),
            (3, Gen::delete_released),
            (5, Gen::handoff),
            (3, Gen::set_payload),
            (3, Gen::set_permits),
            (2, Gen::request_release),
            (3, Gen::revocations),
            (3, Gen::leave_queues),
            (3, Gen::inspect),
            (2, Gen::list),
            (9, Gen::foreign),
            (2, |_, _| Some(Op::TtlPass)),
        ];
        if self.rng.random_ratio(1, 14) {
            return self.sleep(next_deadline);
        }
        let total: u32 = weights.iter().map(|(w, _)| w).sum();
        loop {
            let mut pick = self.rng.random_range(0..total);
            for (weight, draw) in weights {
                if pick < weight {
                    if let Some(op) = draw(self, world) {
                        return op;
                    }
                    break;
                }
                pick -= weight;
            }
        }
    }

    /// Learns from a step's answers: the other applications' locks it now
    /// holds or gave up (by the twin's answer: the mongod's must agree).
    pub fn learn(&mut self, op: &Op, twin: &V) {
        let Op::Foreign(f) = op else { return };
        let done = *twin == V::Bool(true);
        match f {
            Foreign::P1Lock { .. }
            | Foreign::P2Lock { .. }
            | Foreign::P3Lock { .. }
            | Foreign::BareLock { .. }
            | Foreign::SchemaLock { .. }
                if done =>
            {
                self.foreign.push(f.clone())
            }
            Foreign::P1ReleaseById { key } => self
                .foreign
                .retain(|l| !matches!(l, Foreign::P1Lock { key: k, .. } if k == key)),
            Foreign::P1ReleaseByAid => self
                .foreign
                .retain(|l| !matches!(l, Foreign::P1Lock { .. })),
            Foreign::P2Unlock { key, value } => self.foreign.retain(
                |l| !matches!(l, Foreign::P2Lock { key: k, value: v, .. } if k == key && v == value),
            ),
            Foreign::P3Unlock { key } => self
                .foreign
                .retain(|l| !matches!(l, Foreign::P3Lock { key: k, .. } if k == key)),
            Foreign::BareUnlock { key } => self
                .foreign
                .retain(|l| !matches!(l, Foreign::BareLock { key: k } if k == key)),
            Foreign::SchemaUnlock { key } => self
                .foreign
                .retain(|l| !matches!(l, Foreign::SchemaLock { key: k, .. } if k == key)),
            _ => {}
        }
    }

    // ----- choices -----------------------------------------------------------

    fn owner(&mut self) -> usize {
        self.rng.random_range(0..OWNERS.len())
    }

    fn key(&mut self, world: &World) -> LeaseKey {
        world.keys[self.rng.random_range(0..world.keys.len())].clone()
    }

    /// `n` distinct string keys (a group's: only string keys are grouped).
    fn string_keys(&mut self, world: &World, n: usize) -> Vec<LeaseKey> {
        let mut keys: Vec<LeaseKey> = world
            .keys
            .iter()
            .filter(|k| k.as_str().is_some())
            .cloned()
            .collect();
        for i in (1..keys.len()).rev() {
            keys.swap(i, self.rng.random_range(0..=i));
        }
        keys.truncate(n);
        keys
    }

    fn some_keys(&mut self, world: &World) -> Vec<LeaseKey> {
        let keys: Vec<LeaseKey> = world.keys.clone();
        keys.into_iter()
            .filter(|_| self.rng.random_bool(0.5))
            .collect()
    }

    fn ttl(&mut self) -> Duration {
        match self.rng.random_bool(0.6) {
            true => TTL,
            false => TTLS[self.rng.random_range(0..TTLS.len())],
        }
    }

    fn uuid(&mut self) -> Uuid {
        uuid::Builder::from_random_bytes(self.rng.random()).into_uuid()
    }

    fn payload(&mut self) -> Document {
        self.payloads += 1;
        doc! { "p": self.payloads }
    }

    /// Whether the twin holds `used` now under its lease id (at the top or
    /// in `hs`).
    fn held(world: &World, used: &Used) -> bool {
        world.db.doc(used.key.clone()).is_some_and(|d| {
            d.lease_id == Some(used.id) || d.holders.iter().any(|h| h.lease_id == Some(used.id))
        })
    }

    /// A lease id `owner` used that `keep` accepts, mostly one the twin
    /// shows held.
    fn used_by(
        &mut self,
        world: &World,
        owner: usize,
        keep: impl Fn(&Used) -> bool,
    ) -> Option<Used> {
        let mine: Vec<&Used> = self
            .used
            .iter()
            .filter(|u| u.owner == owner && keep(u))
            .collect();
        let held: Vec<&&Used> = mine.iter().filter(|u| Gen::held(world, u)).collect();
        let pick = match (held.is_empty(), self.rng.random_bool(0.75)) {
            (false, true) => *held[self.rng.random_range(0..held.len())],
            _ if mine.is_empty() => return None,
            _ => mine[self.rng.random_range(0..mine.len())],
        };
        Some(pick.clone())
    }

    /// Up to `most` distinct lease ids of `owner`.
    fn leases_of(
        &mut self,
        world: &World,
        owner: usize,
        most: usize,
        exclusive: bool,
    ) -> Vec<Used> {
        let mut picked: Vec<Used> = Vec::new();
        for _ in 0..self.rng.random_range(1..=most) {
            let keep = |u: &Used| !exclusive || u.shape.kind == LeaseKind::Exclusive;
            if let Some(u) = self.used_by(world, owner, keep)
                && !picked.iter().any(|p| p.id == u.id)
            {
                picked.push(u);
            }
        }
        picked
    }

    fn shape(&mut self) -> LeaseShape {
        let mut shape = LeaseShape::default();
        match self.rng.random_range(0..100) {
            0..55 => {
                if self.rng.random_ratio(3, 20) {
                    shape.hold_at_least = Some(HOLDS[self.rng.random_range(0..HOLDS.len())]);
                }
            }
            55..75 => shape.kind = LeaseKind::Shared,
            75..97 => {
                shape.kind = LeaseKind::Permit {
                    permits: self.rng.random_range(2..=3),
                };
                if self.rng.random_ratio(1, 5) {
                    shape.permits_taken = Some(2);
                }
            }
            // Refused before anything is sent, by both.
            97 => shape.kind = LeaseKind::Permit { permits: 0 },
            _ => {
                shape.kind = LeaseKind::Shared;
                shape.hold_at_least = Some(HOLDS[0]);
            }
        }
        shape
    }

    fn remember(&mut self, owner: usize, key: &LeaseKey, id: Uuid, shape: LeaseShape) {
        self.used.push(Used {
            owner,
            key: key.clone(),
            id,
            shape,
        });
    }

    // ----- one function per kind of operation ----------------------------------

    fn acquire(&mut self, world: &World) -> Option<Op> {
        let owner = self.owner();
        let ttl = self.ttl();
        let waiting = self.rng.random_bool(0.5);
        let retry = match self.rng.random_ratio(1, 6) {
            true => self.used_by(world, owner, |_| true),
            false => None,
        };
        let (key, lease_id, shape) = match &retry {
            Some(used) => (used.key.clone(), used.id, used.shape),
            None => {
                let (key, id, shape) = (self.key(world), self.uuid(), self.shape());
                self.remember(owner, &key, id, shape);
                (key, id, shape)
            }
        };
        let payload_odds = match shape.kind {
            LeaseKind::Exclusive => 4,
            _ => 30,
        };
        let payload = self
            .rng
            .random_ratio(1, payload_odds)
            .then(|| self.payload());
        Some(Op::Acquire {
            owner,
            key,
            lease_id,
            retry: retry.is_some(),
            waiting,
            ttl,
            shape,
            payload,
        })
    }

    /// Alone, any TTL; grouped, a long one: a group's answer reads the
    /// local time from the attempt's start to its `find`, which a loaded
    /// machine may stretch past half a short TTL (then not applied), as
    /// the real clock would, not the rules.
    fn light_acquire(&mut self, world: &World) -> Option<Op> {
        let owner = self.owner();
        let (keys, ttl) = match self.rng.random_bool(0.6) {
            true => (vec![self.key(world)], self.ttl()),
            false => {
                let n = self.rng.random_range(2..=3);
                (self.string_keys(world, n), TTL)
            }
        };
        let requests = keys
            .into_iter()
            .map(|key| {
                let id = self.uuid();
                self.remember(owner, &key, id, LeaseShape::default());
                (key, id, ttl)
            })
            .collect();
        Some(Op::LightAcquire { owner, requests })
    }

    fn renew(&mut self, world: &World) -> Option<Op> {
        let owner = self.owner();
        let leases: Vec<LeaseRef> = self
            .leases_of(world, owner, 3, false)
            .iter()
            .map(Used::lease)
            .collect();
        let ttl = TTLS[self.rng.random_range(0..TTLS.len())];
        (!leases.is_empty()).then_some(Op::Renew { owner, leases, ttl })
    }

    fn release(&mut self, world: &World) -> Option<Op> {
        let owner = self.owner();
        let leases: Vec<LeaseRef> = self
            .leases_of(world, owner, 2, false)
            .iter()
            .map(Used::lease)
            .collect();
        (!leases.is_empty()).then_some(Op::Release { owner, leases })
    }

    fn light_release(&mut self, world: &World) -> Option<Op> {
        let owner = self.owner();
        let leases = match self.rng.random_bool(0.4) {
            true => self.group_of_held(world, owner),
            false => self.leases_of(world, owner, 1, true),
        };
        let leases: Vec<LeaseRef> = leases.iter().map(Used::lease).collect();
        let hands_over = self.rng.random_bool(0.5);
        (!leases.is_empty()).then_some(Op::LightRelease {
            owner,
            leases,
            hands_over,
        })
    }

    /// Exclusive leases of `owner` on distinct string keys for a group:
    /// those the twin shows held (two or three), else any.
    fn group_of_held(&mut self, world: &World, owner: usize) -> Vec<Used> {
        let mut held: Vec<Used> = Vec::new();
        for used in self.used.iter().rev() {
            let fits = used.owner == owner
                && used.shape.kind == LeaseKind::Exclusive
                && used.key.as_str().is_some()
                && !held.iter().any(|h| h.key == used.key);
            if fits && Gen::held(world, used) {
                held.push(used.clone());
            }
        }
        if held.len() < 2 {
            let mut any = self.leases_of(world, owner, 3, true);
            let mut seen = Vec::new();
            any.retain(|u| {
                let fresh = u.key.as_str().is_some() && !seen.contains(&u.key);
                seen.push(u.key.clone());
                fresh
            });
            return any;
        }
        held.truncate(self.rng.random_range(2..=3));
        held
    }

    fn release_too_young_to_delete(&mut self, world: &World) -> Option<Op> {
        let owner = self.owner();
        let used = self.used_by(world, owner, |u| u.shape.kind == LeaseKind::Exclusive)?;
        Some(Op::ReleaseTooYoungToDelete {
            owner,
            lease: used.lease(),
        })
    }

    fn release_owner(&mut self, _: &World) -> Option<Op> {
        let operator = self.owner();
        let owner = match self.rng.random_ratio(1, 10) {
            true => world::P1_AID.to_string(),
            false => OWNERS[self.owner()].to_string(),
        };
        let end = self.override_end();
        Some(Op::ReleaseOwner {
            operator,
            owner,
            end,
        })
    }

    /// When an override frees the key of a live lease it ends: at that
    /// lease's expiry (the default) or after the lock-delay alone.
    fn override_end(&mut self) -> OverrideEnd {
        match self.rng.random_bool(0.5) {
            true => OverrideEnd::AtExpiry,
            false => OverrideEnd::Immediately,
        }
    }

    fn force_release(&mut self, world: &World) -> Option<Op> {
        Some(Op::ForceRelease {
            operator: self.owner(),
            key: self.key(world),
            end: self.override_end(),
        })
    }

    /// Mostly by an owner in delete mode, of keys it released.
    fn delete_released(&mut self, world: &World) -> Option<Op> {
        let released: Vec<(usize, LeaseKey)> = world
            .keys
            .iter()
            .filter_map(|key| {
                let doc = world.db.doc(key.clone())?;
                let owner = OWNERS.iter().position(|o| *o == doc.owner)?;
                (doc.lease_id.is_none() && world.owners[owner].delete_mode)
                    .then(|| (owner, key.clone()))
            })
            .collect();
        if released.is_empty() && self.rng.random_bool(0.7) {
            return None;
        }
        if released.is_empty() || self.rng.random_bool(0.2) {
            return Some(Op::DeleteReleased {
                owner: self.owner(),
                keys: self.some_keys(world),
            });
        }
        let (owner, _) = released[self.rng.random_range(0..released.len())].clone();
        let mut keys: Vec<LeaseKey> = released
            .into_iter()
            .filter(|(o, _)| *o == owner)
            .map(|(_, key)| key)
            .collect();
        for key in self.some_keys(world) {
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        Some(Op::DeleteReleased { owner, keys })
    }

    /// As the actor hands over: a plain lease to another.
    fn handoff(&mut self, world: &World) -> Option<Op> {
        let owner = self.owner();
        let from = self.used_by(world, owner, |u| u.shape.kind == LeaseKind::Exclusive)?;
        let to = self.uuid();
        self.remember(owner, &from.key, to, LeaseShape::default());
        Some(Op::Handoff {
            owner,
            key: from.key,
            from: from.id,
            to,
            ttl: self.ttl(),
            light: self.rng.random_bool(0.5),
        })
    }

    fn set_payload(&mut self, world: &World) -> Option<Op> {
        let owner = self.owner();
        let used = self.used_by(world, owner, |_| true)?;
        Some(Op::SetPayload {
            owner,
            lease: used.lease(),
            payload: self.payload(),
        })
    }

    fn set_permits(&mut self, world: &World) -> Option<Op> {
        Some(Op::SetPermits {
            owner: self.owner(),
            key: self.key(world),
            permits: self.rng.random_range(0..=3),
        })
    }

    fn request_release(&mut self, world: &World) -> Option<Op> {
        Some(Op::RequestRelease {
            owner: self.owner(),
            key: self.key(world),
        })
    }

    /// Mostly of keys with a request.
    fn revocations(&mut self, world: &World) -> Option<Op> {
        let mut keys = self.some_keys(world);
        let requested: Vec<&LeaseKey> = world
            .keys
            .iter()
            .filter(|key| {
                world
                    .db
                    .doc((*key).clone())
                    .is_some_and(|d| d.revocation.is_some())
            })
            .collect();
        if requested.is_empty() && self.rng.random_bool(0.7) {
            return None;
        }
        for key in requested {
            if !keys.contains(key) && self.rng.random_bool(0.8) {
                keys.push(key.clone());
            }
        }
        Some(Op::Revocations {
            owner: self.owner(),
            keys,
        })
    }

    /// Mostly by an owner registered somewhere, of its keys.
    fn leave_queues(&mut self, world: &World) -> Option<Op> {
        let registered: Vec<(usize, LeaseKey)> = world
            .keys
            .iter()
            .filter_map(|key| world.db.doc(key.clone()).map(|d| (key, d)))
            .flat_map(|(key, d)| {
                d.queue
                    .iter()
                    .filter_map(|w| OWNERS.iter().position(|o| *o == w.owner))
                    .map(|owner| (owner, key.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        if registered.is_empty() && self.rng.random_bool(0.7) {
            return None;
        }
        let mut keys = self.some_keys(world);
        let owner = match registered.is_empty() || self.rng.random_bool(0.2) {
            true => self.owner(),
            false => {
                let (owner, _) = registered[self.rng.random_range(0..registered.len())].clone();
                for (_, key) in registered.iter().filter(|(o, _)| *o == owner) {
                    if !keys.contains(key) {
                        keys.push(key.clone());
                    }
                }
                owner
            }
        };
        Some(Op::LeaveQueues { owner, keys })
    }

    fn inspect(&mut self, world: &World) -> Option<Op> {
        Some(Op::Inspect {
            owner: self.owner(),
            key: self.key(world),
        })
    }

    fn list(&mut self, world: &World) -> Option<Op> {
        let after = self.rng.random_bool(0.3).then(|| self.key(world));
        Some(Op::List {
            owner: self.owner(),
            after,
            limit: self.rng.random_range(1..=5),
        })
    }

    /// Another application's lock, or the release of one it holds.
    fn foreign(&mut self, world: &World) -> Option<Op> {
        if !self.foreign.is_empty() && self.rng.random_bool(0.4) {
            let held = self.foreign[self.rng.random_range(0..self.foreign.len())].clone();
            return Some(Op::Foreign(match held {
                Foreign::P1Lock { .. } if self.rng.random_bool(0.3) => Foreign::P1ReleaseByAid,
                Foreign::P1Lock { key, .. } => Foreign::P1ReleaseById { key },
                Foreign::P2Lock { key, value, .. } => Foreign::P2Unlock { key, value },
                Foreign::P3Lock { key, .. } => Foreign::P3Unlock { key },
                Foreign::BareLock { key } => Foreign::BareUnlock { key },
                Foreign::SchemaLock { key, .. } => Foreign::SchemaUnlock { key },
                other => unreachable!("a lock, not {other:?}"),
            }));
        }
        let key = self.key(world);
        Some(Op::Foreign(match self.rng.random_range(0..5) {
            0 => Foreign::P1Lock {
                key,
                aged: self.rng.random_bool(0.3),
            },
            1 => Foreign::P2Lock {
                key,
                value: P2_VALUES[self.rng.random_range(0..P2_VALUES.len())],
                ttl: P2_TTLS[self.rng.random_range(0..P2_TTLS.len())],
            },
            2 => Foreign::P3Lock {
                key,
                lifetime: P3_LIFETIMES[self.rng.random_range(0..P3_LIFETIMES.len())],
            },
            3 => Foreign::BareLock { key },
            _ => Foreign::SchemaLock {
                key,
                life: self
                    .rng
                    .random_bool(0.6)
                    .then(|| P3_LIFETIMES[self.rng.random_range(0..P3_LIFETIMES.len())]),
            },
        }))
    }

    /// Time passes: just past the next expiry if one is within 700 ms, else
    /// a few ms.
    fn sleep(&mut self, next_deadline: Option<Duration>) -> Op {
        match next_deadline.filter(|d| *d <= Duration::from_millis(700)) {
            Some(until) => Op::Sleep(until),
            None => Op::Sleep(Duration::from_millis(self.rng.random_range(5..40))),
        }
    }
}

// ----- applying a step ------------------------------------------------------------

/// A step's answers: each side's in the normal form, and as they came
/// (for the report).
pub(super) struct Answers {
    pub twin: V,
    pub mongo: V,
    pub twin_raw: String,
    pub mongo_raw: String,
}

impl Answers {
    fn new<T: std::fmt::Debug>(twin: (V, T), mongo: (V, T)) -> Answers {
        Answers {
            twin_raw: format!("{:?}", twin.1),
            mongo_raw: format!("{:?}", mongo.1),
            twin: twin.0,
            mongo: mongo.0,
        }
    }
}

/// Applies `op` to both sides at once (the twin's call first, polled
/// together with the mongod's).
pub(super) async fn apply(world: &World, op: &Op) -> Answers {
    let side = |owner: &usize| &world.owners[*owner];
    macro_rules! both {
        ($owner:expr, |$s:ident| $call:expr, $norm:expr) => {{
            let o = side($owner);
            let twin = {
                let $s = &o.twin;
                $call
            };
            let mongo = {
                let $s = &o.mongo;
                $call
            };
            let (t, m) = tokio::join!(twin, mongo);
            let norm = $norm;
            Answers::new((norm(&t), &t), (norm(&m), &m))
        }};
    }
    match op {
        Op::Acquire {
            owner,
            key,
            lease_id,
            waiting,
            ttl,
            shape,
            payload,
            ..
        } => {
            let request = AcquireRequest {
                key: key.clone(),
                lease_id: *lease_id,
                waiting: *waiting,
                ttl: *ttl,
                shape: *shape,
                create: None,
                payload: payload.clone(),
            };
            both!(
                owner,
                |s| {
                    let acquire = s.acquire(request.clone());
                    async move { acquire.await.map(|(outcome, _)| outcome) }
                },
                |r| Reply::acquire(key, r)
            )
        }
        Op::LightAcquire { owner, requests } => {
            let started = Instant::now();
            let light: Vec<LightAcquire> = requests
                .iter()
                .map(|(key, lease_id, ttl)| LightAcquire {
                    key: key.clone(),
                    lease_id: *lease_id,
                    ttl: *ttl,
                    started,
                })
                .collect();
            let keys: Vec<LeaseKey> = requests.iter().map(|r| r.0.clone()).collect();
            both!(owner, |s| s.acquire_light(light.clone()), |r: &Vec<_>| {
                Reply::light_acquired(&keys, r)
            })
        }
        Op::Renew { owner, leases, ttl } => {
            both!(
                owner,
                |s| s.renew_with_ttl(leases.clone(), *ttl),
                Reply::lost
            )
        }
        Op::Release { owner, leases } => {
            both!(owner, |s| s.release_by_id(leases.clone()), Reply::count)
        }
        Op::LightRelease {
            owner,
            leases,
            hands_over,
        } => {
            both!(
                owner,
                |s| s.release_light(leases.clone(), *hands_over),
                |r: &Vec<_>| { Reply::light_released(r) }
            )
        }
        Op::ReleaseTooYoungToDelete { owner, lease } => {
            both!(
                owner,
                |s| s.release_too_young_to_delete(lease.clone()),
                Reply::count
            )
        }
        Op::ReleaseOwner {
            operator,
            owner,
            end,
        } => {
            both!(
                operator,
                |s| s.release_owner(owner.clone(), *end),
                Reply::count
            )
        }
        Op::ForceRelease { operator, key, end } => {
            both!(
                operator,
                |s| s.force_release(key.clone(), *end),
                Reply::info
            )
        }
        Op::DeleteReleased { owner, keys } => {
            both!(owner, |s| s.delete_released(keys.clone()), Reply::count)
        }
        Op::Handoff {
            owner,
            key,
            from,
            to,
            ttl,
            light,
        } => both!(
            owner,
            |s| s.handoff_to(key.clone(), (*from, *to), *ttl, *light),
            |r| Reply::handoff(key, r)
        ),
        Op::SetPayload {
            owner,
            lease,
            payload,
        } => both!(
            owner,
            |s| s.set_payload(lease.clone(), payload.clone()),
            Reply::flag
        ),
        Op::SetPermits {
            owner,
            key,
            permits,
        } => both!(
            owner,
            |s| s.set_permits(key.clone(), *permits),
            Reply::permits
        ),
        Op::RequestRelease { owner, key } => {
            both!(owner, |s| s.request_release(key.clone()), Reply::flag)
        }
        Op::Revocations { owner, keys } => {
            both!(owner, |s| s.revocations(keys.clone()), Reply::revocations)
        }
        Op::LeaveQueues { owner, keys } => {
            both!(owner, |s| s.leave_queues(keys.clone()), Reply::count)
        }
        Op::Inspect { owner, key } => both!(owner, |s| s.inspect(key.clone()), Reply::info),
        Op::List {
            owner,
            after,
            limit,
        } => both!(owner, |s| s.list(after.clone(), *limit), Reply::page),
        Op::Foreign(foreign) => apply_foreign(world, foreign).await,
        // What it deleted shows in the documents (the counts would repeat
        // each difference).
        Op::TtlPass => {
            let twin = world.twin_ttl_pass();
            let mongo = world.mongo_ttl_pass().await;
            Answers::new((V::Null, twin), (V::Null, mongo))
        }
        Op::Sleep(d) => {
            tokio::time::sleep(*d).await;
            Answers::new((V::Null, ()), (V::Null, ()))
        }
    }
}

/// Another application's command, by its exact protocol on the mongod and
/// by `MemoryDb`'s equivalent on the twin.
async fn apply_foreign(world: &World, foreign: &Foreign) -> Answers {
    let flags = |t: bool, m: bool| Answers::new((Reply::plain(t), t), (Reply::plain(m), m));
    match foreign {
        Foreign::P1Lock { key, aged } => {
            let age = if *aged { P1_AGE } else { Duration::ZERO };
            flags(
                world.twin_p1_lock(key, age),
                world.mongo_p1_lock(key, age).await,
            )
        }
        Foreign::P1ReleaseById { key }
        | Foreign::P3Unlock { key }
        | Foreign::BareUnlock { key } => flags(
            world.twin_delete_by_id(key),
            world.mongo_delete_by_id(key).await,
        ),
        Foreign::P1ReleaseByAid => {
            let twin = world.twin_p1_release_by_aid();
            let mongo = world.mongo_p1_release_by_aid().await;
            Answers::new((Reply::number(twin), twin), (Reply::number(mongo), mongo))
        }
        Foreign::P2Lock { key, value, ttl } => flags(
            world.twin_p2_lock(key, value, *ttl),
            world.mongo_p2_lock(key, value, *ttl).await,
        ),
        Foreign::P2Unlock { key, value } => flags(
            world.twin_p2_unlock(key, value),
            world.mongo_p2_unlock(key, value).await,
        ),
        Foreign::P3Lock { key, lifetime } => flags(
            world.twin_p3_lock(key, *lifetime),
            world.mongo_p3_lock(key, *lifetime).await,
        ),
        Foreign::BareLock { key } => {
            flags(world.twin_bare_lock(key), world.mongo_bare_lock(key).await)
        }
        Foreign::SchemaLock { key, life } => flags(
            world.twin_schema_lock(key, *life),
            world.mongo_schema_lock(key, *life).await,
        ),
        Foreign::SchemaUnlock { key } => flags(
            world.twin_schema_unlock(key),
            world.mongo_schema_unlock(key).await,
        ),
    }
}
