//! `oci-archive` files (a tar of an OCI image layout): safe extraction into a
//! private directory that is then opened as a [`crate::layout::Layout`]. (owner: activator-core)
