//! Rendering of the host files. PLACEHOLDER on branch host-side, replaced by
//! branch host-render's implementation on merge: only the API contract
//! (`gather`, `render`, `write`, `diff`) so the flip engine compiles.

use std::path::PathBuf;

use crate::config::Config;
use crate::layout::write_atomic;
use crate::paths::Root;
use crate::state::Slot;

pub struct HostFacts {
    pub hostname: String,
    pub nameservers: Vec<String>,
    pub ca_pem: String,
    pub gpu: crate::gpu::GpuBinds,
    pub devices: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedFile {
    pub path: PathBuf,
    pub contents: String,
    pub mode: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostFiles {
    pub files: Vec<RenderedFile>,
}

pub struct WriteOutcome {
    pub changed: Vec<PathBuf>,
    pub dropin_changed: bool,
}

pub struct FileDiff {
    pub path: PathBuf,
    pub diff: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("{path}: {reason}")]
    Io { path: PathBuf, reason: String },
}

pub fn gather(root: &Root, config: &Config) -> Result<HostFacts, RenderError> {
    let ca_pem = match (&config.kubelet.ca_data, &config.kubelet.ca_file) {
        (Some(d), _) => d.clone(),
        (None, Some(f)) => {
            let p = root.join(&f.to_string_lossy());
            std::fs::read_to_string(&p).map_err(|e| RenderError::Io {
                path: p,
                reason: e.to_string(),
            })?
        }
        _ => String::new(),
    };
    Ok(HostFacts {
        hostname: "host".into(),
        nameservers: vec!["192.0.2.53".into()],
        ca_pem,
        gpu: Default::default(),
        devices: Vec::new(),
    })
}

pub fn render(config: &Config, slot: Slot, facts: &HostFacts) -> HostFiles {
    let m = slot.machine();
    HostFiles {
        files: vec![
            RenderedFile {
                path: format!("etc/kubeslot/host/{m}/ca.crt").into(),
                contents: facts.ca_pem.clone(),
                mode: 0o644,
            },
            RenderedFile {
                path: format!("etc/kubeslot/host/{m}/labels").into(),
                contents: format!("{:?}\n", config.kubelet.labels),
                mode: 0o644,
            },
            RenderedFile {
                path: format!("etc/systemd/nspawn/{m}.nspawn").into(),
                contents: "[Exec]\nBoot=yes\n".into(),
                mode: 0o644,
            },
            RenderedFile {
                path: format!("etc/systemd/system/systemd-nspawn@{m}.service.d/override.conf")
                    .into(),
                contents: "[Service]\nRestart=on-failure\n".into(),
                mode: 0o644,
            },
        ],
    }
}

pub fn write(root: &Root, files: &HostFiles) -> Result<WriteOutcome, RenderError> {
    let mut changed = Vec::new();
    for f in &files.files {
        let p = root.join(&f.path.to_string_lossy());
        if std::fs::read_to_string(&p).ok().as_deref() == Some(f.contents.as_str()) {
            continue;
        }
        std::fs::create_dir_all(p.parent().unwrap()).map_err(|e| RenderError::Io {
            path: p.clone(),
            reason: e.to_string(),
        })?;
        write_atomic(&p, f.contents.as_bytes()).map_err(|e| RenderError::Io {
            path: p.clone(),
            reason: e.to_string(),
        })?;
        changed.push(f.path.clone());
    }
    let dropin_changed = changed
        .iter()
        .any(|p| p.to_string_lossy().contains(".service.d"));
    Ok(WriteOutcome {
        changed,
        dropin_changed,
    })
}

pub fn diff(root: &Root, files: &HostFiles) -> Vec<FileDiff> {
    files
        .files
        .iter()
        .map(|f| {
            let p = root.join(&f.path.to_string_lossy());
            let old = std::fs::read_to_string(&p).unwrap_or_default();
            FileDiff {
                path: f.path.clone(),
                diff: if old == f.contents {
                    String::new()
                } else {
                    format!("-{old}\n+{}\n", f.contents)
                },
            }
        })
        .collect()
}
