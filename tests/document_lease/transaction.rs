//! The transaction helper: writes committed only while the lease is held,
//! transient transaction errors retried, a clear error on a standalone server.
