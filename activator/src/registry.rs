//! A small blocking client for the OCI distribution API: token and basic auth,
//! GET manifest by tag or digest, GET blob streamed. (owner: activator-core)
