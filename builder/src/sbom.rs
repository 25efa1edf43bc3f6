//! SPDX 2.3 SBOM generation. (owner: publishing)
