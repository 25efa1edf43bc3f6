//! Pushing to and pulling from registries (oci-client). (owner: publishing)
