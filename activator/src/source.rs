//! Image sources the activator reads from: a registry with ordered mirrors, an
//! OCI layout, an oci-archive. Resolves a tag to a digest once. (owner: activator-core)
