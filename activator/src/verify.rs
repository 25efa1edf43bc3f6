//! Trust policy: signatures checked before any layer is fetched. (owner: activator-core)
