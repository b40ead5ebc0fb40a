//! Unit tests of the commands' BSON and of their replies, without a
//! server, and the light forms' tests on a real `mongod`.

use mongodb::bson::{Bson, Document, doc};
use uuid::Uuid;

use super::MongoStore;
use super::acquire::*;
use super::handle::*;
use super::handoff::*;
use super::payload::*;
use super::raw::*;
use super::read::*;
use super::release::*;
use super::renew::*;
use super::rules::*;
use super::watch::*;
use crate::key::LeaseKey;
use crate::store::{LeaseRef, field};

mod kinds;
mod light;
mod light_unit;
mod pipeline;
mod queue;
mod raw;
mod renewal;
