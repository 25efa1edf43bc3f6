//! The content store under `/var/lib/kubeslot/blobs`: verified blobs only. (owner: activator-core)
