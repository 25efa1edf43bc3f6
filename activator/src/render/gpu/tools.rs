//! The NVIDIA driver's tools (`nvidia-smi`, `nvidia-debugdump`,
//! `nvidia-persistenced`, `nvidia-cuda-mps-*`, `nvidia-imex*`): which host
//! files a node machine gets at `/run/host-nvidia-bin`, and how they are
//! bound.
//!
//! Given the root handle, the [`DriverSource`] (whose tree symlinks resolve
//! in) and the library directories already chosen. A tool is a real
//! executable: an ELF file, symlinks followed. It is looked for in the
//! driver's own `bin` beside its libraries (`<root>/bin` for
//! `<root>/lib64`, `<root>/lib` or `<root>/lib/<triplet>`), then in the
//! distribution's `/usr/bin` (of the driver's tree); the first directory
//! that has a name wins. A script that only execs another path (the
//! `/usr/bin/nvidia-smi` wrapper some images put in front of
//! `/usr/local/nvidia/bin/nvidia-smi`) is no tool: it stands for its
//! target when that target is a tool these rules find, and is otherwise
//! left out with the reason ([`DriverTools::skipped`]), which `plan` (a
//! comment in the `.nspawn` file) and `preflight` (`gpu-tools`) show.
//!
//! Bind rule: never a system directory (`/usr/bin`, `/usr/local/bin`, ...)
//! whole: the node would get every program of the host. The driver's `bin`
//! directory is bound whole when every tool comes from it and it holds
//! nothing but driver tools (an upgrade in place then needs no new
//! render); otherwise each tool file is bound on its own, read-only, at
//! `/run/host-nvidia-bin/<name>`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use super::libraries::DriverSource;
use super::{read_elf, Arch};
use crate::paths::{host, Root};

/// One driver tool, bound at `/run/host-nvidia-bin/<name>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tool {
    /// The name the node runs it by (`nvidia-smi`).
    pub name: String,
    /// The host file (symlinks followed).
    pub file: String,
}

/// How the tools are bound.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolBind {
    /// No driver tool was found.
    #[default]
    None,
    /// The driver's own `bin` directory, whole.
    Dir(String),
    /// Each tool file on its own, sorted by name.
    Files(Vec<Tool>),
}

/// A file named like a driver tool that is not bound, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// Host-absolute.
    pub path: String,
    /// What it is, said of the file: "is not an ELF executable".
    pub reason: String,
}

/// The driver's tools found on the host.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverTools {
    pub bind: ToolBind,
    /// Every tool, sorted by name (whatever the bind).
    pub tools: Vec<Tool>,
    pub skipped: Vec<Skipped>,
}

/// Whether `name` is one of the driver's tools (and a name safe in a bind
/// line).
fn is_tool_name(name: &str) -> bool {
    let known = matches!(
        name,
        "nvidia-smi" | "nvidia-debugdump" | "nvidia-persistenced"
    ) || name.starts_with("nvidia-cuda-mps-")
        || name.starts_with("nvidia-imex");
    known
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Scripts larger than this are not read (a wrapper is a few lines).
const MAX_SCRIPT: u64 = 64 * 1024;

/// What a file named like a tool turned out to be.
enum Kind {
    /// An executable ELF file (host-absolute, resolved).
    Elf(String),
    /// A script that execs this absolute path (as its tree names it).
    Wrapper(String),
    /// Anything else, with the reason it is no tool.
    Not(String),
}

fn classify(root: &Root, source: &DriverSource, path: &str) -> Kind {
    let Some(file) = source.resolve_file(root, path) else {
        return Kind::Not("does not resolve to a file".into());
    };
    let on_disk = root.join(&file);
    if read_elf(&on_disk).is_some() {
        let executable =
            std::fs::metadata(&on_disk).is_ok_and(|m| m.permissions().mode() & 0o111 != 0);
        return if executable {
            Kind::Elf(file)
        } else {
            Kind::Not(format!("is not executable ({file})"))
        };
    }
    let mut text = String::new();
    let read =
        std::fs::File::open(&on_disk).and_then(|f| f.take(MAX_SCRIPT).read_to_string(&mut text));
    if read.is_err() || !text.starts_with("#!") {
        return Kind::Not("is not an ELF executable".into());
    }
    match exec_target(&text) {
        Some(target) => Kind::Wrapper(target),
        None => Kind::Not("is a script that execs no absolute path".into()),
    }
}

/// The absolute path a wrapper script execs (`exec /usr/local/nvidia/bin/
/// nvidia-smi "$@"`): the first `exec` command whose program is a literal
/// absolute path.
fn exec_target(script: &str) -> Option<String> {
    script.lines().skip(1).find_map(|line| {
        let mut words = line.split_whitespace();
        if words.next() != Some("exec") {
            return None;
        }
        let program = words.next()?.trim_matches(|c| c == '"' || c == '\'');
        let literal =
            program.starts_with('/') && !program.contains(['$', '`', '*', '?', '[', ';', '&', '|']);
        literal.then(|| program.to_string())
    })
}

/// The directories tools are looked for in, in order: the `bin` beside
/// each library directory, then the driver tree's `/usr/bin`.
fn candidate_dirs(source: &DriverSource, library_dirs: &[String], arch: Arch) -> Vec<String> {
    let mut dirs: Vec<String> = Vec::new();
    let beside = library_dirs
        .iter()
        .filter_map(|d| bin_beside(d, arch.triplet()));
    for d in beside.chain([source.outer(host::DISTRO_BIN)]) {
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs
}

/// `<root>/bin` for `<root>/lib64`, `<root>/lib` and `<root>/lib/<triplet>`.
fn bin_beside(lib_dir: &str, triplet: &str) -> Option<String> {
    let dir = lib_dir
        .strip_suffix(&format!("/{triplet}"))
        .filter(|d| d.ends_with("/lib"))
        .unwrap_or(lib_dir);
    let parent = dir
        .strip_suffix("/lib64")
        .or_else(|| dir.strip_suffix("/lib"))?;
    Some(format!("{parent}/bin"))
}

/// The tool names in `dir` (sorted; an unreadable directory has none).
fn tool_names(root: &Root, dir: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| is_tool_name(n))
        .collect();
    names.sort();
    names
}

/// Finds the driver's tools for the chosen library directories and decides
/// how they are bound.
pub fn find(
    root: &Root,
    source: &DriverSource,
    library_dirs: &[String],
    arch: Arch,
) -> DriverTools {
    let dirs = candidate_dirs(source, library_dirs, arch);
    // name -> (tool, the directory it was found in)
    let mut found: BTreeMap<String, (Tool, String)> = BTreeMap::new();
    let mut skipped = Vec::new();
    for dir in &dirs {
        for name in tool_names(root, dir) {
            if found.contains_key(&name) {
                continue;
            }
            let path = format!("{dir}/{name}");
            let (file, from) = match classify(root, source, &path) {
                Kind::Elf(file) => (file, dir.clone()),
                Kind::Wrapper(target) => match wrapped_tool(root, source, &dirs, &target) {
                    Ok((file, from)) => (file, from),
                    Err(reason) => {
                        skipped.push(Skipped { path, reason });
                        continue;
                    }
                },
                Kind::Not(reason) => {
                    skipped.push(Skipped { path, reason });
                    continue;
                }
            };
            found.insert(name.clone(), (Tool { name, file }, from));
        }
    }
    let tools: Vec<Tool> = found.values().map(|(t, _)| t.clone()).collect();
    let from: BTreeSet<&str> = found.values().map(|(_, d)| d.as_str()).collect();
    let only_dir = if from.len() == 1 { from.first() } else { None };
    let bind = match only_dir {
        _ if tools.is_empty() => ToolBind::None,
        // the directory's bind must carry every tool under its own name
        Some(dir)
            if tools.iter().all(|t| root.join(dir).join(&t.name).exists())
                && holds_only_tools(root, source, dir) =>
        {
            ToolBind::Dir(dir.to_string())
        }
        _ => ToolBind::Files(tools.clone()),
    };
    DriverTools {
        bind,
        tools,
        skipped,
    }
}

/// The tool a wrapper's `target` (as the driver's tree names it) is, when
/// these rules find it: in a candidate directory, named like a tool, an
/// executable ELF file.
fn wrapped_tool(
    root: &Root,
    source: &DriverSource,
    dirs: &[String],
    target: &str,
) -> Result<(String, String), String> {
    let outer = source.outer(target);
    let p = Path::new(&outer);
    let dir = p.parent().map(|d| d.to_string_lossy().into_owned());
    let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
    let not_found = || {
        format!(
            "is a script that runs {target}, which is not a driver tool beside the driver's libraries or in {}",
            host::DISTRO_BIN
        )
    };
    let (Some(dir), Some(name)) = (dir, name) else {
        return Err(not_found());
    };
    if !dirs.contains(&dir) || !is_tool_name(&name) {
        return Err(not_found());
    }
    match classify(root, source, &outer) {
        Kind::Elf(file) => Ok((file, dir)),
        Kind::Wrapper(_) => Err(format!("is a script that runs {target}, another script")),
        Kind::Not(why) => Err(format!("is a script that runs {target}, which {why}")),
    }
}

/// Whether `dir` may be bound whole: not a system directory (of the host or
/// the driver's tree), and every entry in it is a driver tool whose file is
/// in it.
fn holds_only_tools(root: &Root, source: &DriverSource, dir: &str) -> bool {
    let real = source.resolve(root, dir);
    let system = [Some(dir.to_string()), real.clone()]
        .into_iter()
        .flatten()
        .any(|d| host::SYSTEM_BIN_DIRS.iter().any(|s| d == source.outer(s)));
    let Some(real) = real else {
        return false;
    };
    if system {
        return false;
    }
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
        return false;
    };
    entries.filter_map(Result::ok).all(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        is_tool_name(&name)
            && match classify(root, source, &format!("{dir}/{name}")) {
                Kind::Elf(file) => Path::new(&file).parent() == Some(Path::new(&real)),
                _ => false,
            }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::gpu::write_elf;

    fn host() -> (tempfile::TempDir, Root) {
        let d = tempfile::tempdir().unwrap();
        let root = Root::new(d.path());
        (d, root)
    }

    /// An executable ELF file under the root.
    fn elf(root: &Root, rel: &str) {
        let p = root.join(rel);
        write_elf(&p, true, 62);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn script(root: &Root, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn cache(root: &Root, lib_dirs: &[&str]) -> DriverTools {
        let dirs: Vec<String> = lib_dirs.iter().map(|d| d.to_string()).collect();
        find(root, &DriverSource::LoaderCache, &dirs, Arch::Amd64)
    }

    fn tool(name: &str, file: &str) -> Tool {
        Tool {
            name: name.into(),
            file: file.into(),
        }
    }

    #[test]
    fn the_bin_beside_the_libraries() {
        let t = "x86_64-linux-gnu";
        assert_eq!(
            bin_beside("/usr/local/nvidia/lib64", t).as_deref(),
            Some("/usr/local/nvidia/bin")
        );
        assert_eq!(
            bin_beside("/usr/local/nvidia/lib", t).as_deref(),
            Some("/usr/local/nvidia/bin")
        );
        assert_eq!(
            bin_beside("/usr/lib/x86_64-linux-gnu", t).as_deref(),
            Some("/usr/bin")
        );
        assert_eq!(
            bin_beside("/lib/x86_64-linux-gnu", t).as_deref(),
            Some("/bin")
        );
        assert_eq!(bin_beside("/usr/lib/x86_64-linux-gnu/vdpau", t), None);
        assert_eq!(
            bin_beside("/usr/lib/x86_64-linux-gnu/nvidia/current", t),
            None
        );
        assert_eq!(bin_beside("/opt/x86_64-linux-gnu", t), None);
    }

    #[test]
    fn a_wrapper_names_the_path_it_execs() {
        for (text, want) in [
            (
                "#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi \"$@\"\n",
                Some("/usr/local/nvidia/bin/nvidia-smi"),
            ),
            (
                "#!/bin/bash\n# wrapper\nset -e\nexec \"/opt/nv/bin/nvidia-smi\" \"$@\"\n",
                Some("/opt/nv/bin/nvidia-smi"),
            ),
            ("#!/bin/sh\nexec $NVIDIA_ROOT/bin/nvidia-smi \"$@\"\n", None),
            ("#!/bin/sh\nnvidia-smi \"$@\"\n", None),
            ("#!/bin/sh\nexec nvidia-smi.real \"$@\"\n", None),
        ] {
            assert_eq!(exec_target(text).as_deref(), want, "{text}");
        }
    }

    #[test]
    fn the_usr_local_nvidia_layout_binds_its_bin_dir_whole() {
        // the H200 host: the driver under /usr/local/nvidia, a wrapper in
        // /usr/bin that execs its nvidia-smi
        let (_d, root) = host();
        for t in ["nvidia-smi", "nvidia-debugdump", "nvidia-cuda-mps-control"] {
            elf(&root, &format!("usr/local/nvidia/bin/{t}"));
        }
        script(
            &root,
            "usr/bin/nvidia-smi",
            "#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi \"$@\"\n",
        );
        elf(&root, "usr/bin/ls");
        let found = cache(&root, &["/usr/local/nvidia/lib64"]);
        assert_eq!(found.bind, ToolBind::Dir("/usr/local/nvidia/bin".into()));
        assert_eq!(
            found.tools,
            [
                tool(
                    "nvidia-cuda-mps-control",
                    "/usr/local/nvidia/bin/nvidia-cuda-mps-control"
                ),
                tool("nvidia-debugdump", "/usr/local/nvidia/bin/nvidia-debugdump"),
                tool("nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi"),
            ]
        );
        assert!(found.skipped.is_empty(), "{found:?}");

        // anything else in that directory: each tool on its own
        elf(&root, "usr/local/nvidia/bin/nvidia-installer");
        let found = cache(&root, &["/usr/local/nvidia/lib64"]);
        assert_eq!(found.bind, ToolBind::Files(found.tools.clone()));
        assert_eq!(found.tools.len(), 3);
    }

    #[test]
    fn a_wrapper_alone_stands_for_its_target_when_that_is_found() {
        // the libraries' bin has no nvidia-smi of that name... but the
        // wrapper in /usr/bin points into it
        let (_d, root) = host();
        elf(&root, "usr/local/nvidia/bin/nvidia-smi.real");
        elf(&root, "usr/local/nvidia/bin/nvidia-debugdump");
        script(
            &root,
            "usr/bin/nvidia-smi",
            "#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-smi.real \"$@\"\n",
        );
        let found = cache(&root, &["/usr/local/nvidia/lib64"]);
        // nvidia-smi.real is no tool name: the wrapper's target is not found
        assert_eq!(
            found.tools,
            [tool(
                "nvidia-debugdump",
                "/usr/local/nvidia/bin/nvidia-debugdump"
            )]
        );
        assert_eq!(found.skipped.len(), 1);
        assert!(
            found.skipped[0].reason.contains("not a driver tool"),
            "{found:?}"
        );

        // a wrapper in /usr/bin for a tool the driver's bin has under
        // another tool name stands for that file
        let (_d, root) = host();
        elf(&root, "usr/local/nvidia/bin/nvidia-imex");
        script(
            &root,
            "usr/bin/nvidia-imex-ctl",
            "#!/bin/sh\nexec /usr/local/nvidia/bin/nvidia-imex --ctl \"$@\"\n",
        );
        let found = cache(&root, &["/usr/local/nvidia/lib64"]);
        assert_eq!(
            found.tools,
            [
                tool("nvidia-imex", "/usr/local/nvidia/bin/nvidia-imex"),
                tool("nvidia-imex-ctl", "/usr/local/nvidia/bin/nvidia-imex"),
            ]
        );
        // both files are in /usr/local/nvidia/bin, which holds only tools
        assert_eq!(
            found.bind,
            ToolBind::Files(found.tools.clone()),
            "one came through /usr/bin"
        );
    }

    #[test]
    fn the_distro_layout_binds_each_tool_never_usr_bin() {
        let (_d, root) = host();
        elf(&root, "usr/bin/nvidia-smi");
        elf(&root, "usr/bin/nvidia-persistenced");
        // even a /usr/bin with nothing but driver tools is a system dir
        let found = cache(&root, &["/usr/lib/x86_64-linux-gnu"]);
        assert_eq!(
            found.bind,
            ToolBind::Files(vec![
                tool("nvidia-persistenced", "/usr/bin/nvidia-persistenced"),
                tool("nvidia-smi", "/usr/bin/nvidia-smi"),
            ])
        );
        // nor through a link (usrmerge's /bin), nor /usr/local/bin
        let (_d, root) = host();
        elf(&root, "usr/local/bin/nvidia-smi");
        std::os::unix::fs::symlink("usr/local/bin", root.join("tools")).unwrap();
        std::fs::create_dir_all(root.join("tools-root")).unwrap();
        let found = find(
            &root,
            &DriverSource::LoaderCache,
            &["/usr/local/lib64".into()],
            Arch::Amd64,
        );
        assert_eq!(
            found.bind,
            ToolBind::Files(vec![tool("nvidia-smi", "/usr/local/bin/nvidia-smi")])
        );
    }

    #[test]
    fn what_is_not_an_executable_is_skipped_with_the_reason() {
        let (_d, root) = host();
        script(&root, "usr/bin/nvidia-smi", "#!/bin/sh\necho fake\n");
        write_elf(&root.join("usr/bin/nvidia-debugdump"), true, 62); // mode 0644
        std::fs::write(root.join("usr/bin/nvidia-persistenced"), b"\0\0\0\0data").unwrap();
        std::os::unix::fs::symlink("/gone", root.join("usr/bin/nvidia-cuda-mps-server")).unwrap();
        script(
            &root,
            "usr/bin/nvidia-cuda-mps-control",
            "#!/bin/sh\nexec /usr/bin/nvidia-smi \"$@\"\n",
        );
        let found = cache(&root, &["/usr/lib/x86_64-linux-gnu"]);
        assert_eq!(found.bind, ToolBind::None);
        let got: Vec<(&str, &str)> = found
            .skipped
            .iter()
            .map(|s| (s.path.as_str(), s.reason.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("/usr/bin/nvidia-cuda-mps-control", "is a script that runs /usr/bin/nvidia-smi, which is a script that execs no absolute path"),
                ("/usr/bin/nvidia-cuda-mps-server", "does not resolve to a file"),
                ("/usr/bin/nvidia-debugdump", "is not executable (/usr/bin/nvidia-debugdump)"),
                ("/usr/bin/nvidia-persistenced", "is not an ELF executable"),
                ("/usr/bin/nvidia-smi", "is a script that execs no absolute path"),
            ]
        );
    }

    #[test]
    fn a_driver_tree_resolves_its_links_inside_itself() {
        // the GPU operator's driver container: usr/bin/nvidia-smi ->
        // /usr/lib/nvidia/nvidia-smi means the tree's, not the host's
        let (_d, root) = host();
        let tree = "run/nvidia/driver";
        elf(&root, &format!("{tree}/usr/lib/nvidia/nvidia-smi"));
        elf(&root, &format!("{tree}/usr/bin/bash"));
        std::fs::create_dir_all(root.join("usr/lib/nvidia")).unwrap();
        std::os::unix::fs::symlink(
            "/usr/lib/nvidia/nvidia-smi",
            root.join(&format!("{tree}/usr/bin/nvidia-smi")),
        )
        .unwrap();
        let source = DriverSource::Tree {
            dir: "/run/nvidia/driver".into(),
            detected: true,
        };
        let found = find(
            &root,
            &source,
            &["/run/nvidia/driver/usr/lib/x86_64-linux-gnu".into()],
            Arch::Amd64,
        );
        assert_eq!(
            found.bind,
            ToolBind::Files(vec![tool(
                "nvidia-smi",
                "/run/nvidia/driver/usr/lib/nvidia/nvidia-smi"
            )])
        );
    }
}
