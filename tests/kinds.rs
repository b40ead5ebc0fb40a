//! Semaphores, shared/exclusive (read/write) keys and minimum holds
//! (`hold_at_least`) through the public API, on a real mongod. Several
//! managers, each on its own client, play several processes; plain driver
//! reads show what the lock collection holds.

#[path = "common/mod.rs"]
mod common;
#[path = "kinds/support.rs"]
mod support;

#[path = "kinds/hold.rs"]
mod hold;
#[path = "kinds/input.rs"]
mod input;
#[path = "kinds/many.rs"]
mod many;
#[path = "kinds/renewal.rs"]
mod renewal;
#[path = "kinds/resize.rs"]
mod resize;
#[path = "kinds/semaphore.rs"]
mod semaphore;
#[path = "kinds/semaphore_wake.rs"]
mod semaphore_wake;
#[path = "kinds/shared.rs"]
mod shared;
