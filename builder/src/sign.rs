//! Key generation and cosign simple-signing signatures. (owner: publishing)
