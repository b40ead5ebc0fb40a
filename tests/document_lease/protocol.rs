//! The in-document protocol as stored: lock fields under one field, user
//! fields never touched by acquire, renewal or release, change events.
