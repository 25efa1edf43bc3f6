//! The recipe: its TOML schema, parsing, validation, and turning it into the
//! list of pinned inputs for one platform.
//!
//! Given a recipe file (and the command line's download overrides), it
//! produces a [`Recipe`] whose every remote input has a sha256 for every
//! platform it builds, whose files exist, whose units are baked, and whose
//! layer groups are all named and used. Unknown fields are errors everywhere
//! (`deny_unknown_fields`); TOML errors carry the file, line and column.
//!
//! It deliberately does not fetch, read archives or write anything: it only
//! says what to get from where and where it goes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Component, Path, PathBuf};

use kubeslot_image::oci::Platform;
use kubeslot_image::{Digest, ImageSource};
use serde::{Deserialize, Deserializer};

use crate::debian::DebianBase;
use crate::fetch::Pinned;

/// Why a recipe is unusable; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum RecipeError {
    #[error("recipe {path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: {at}: {rule}")]
    Invalid {
        path: PathBuf,
        at: String,
        rule: String,
    },
}

/// The layer group holding the base rootfs (or every layer of a base image).
pub const BASE_GROUP: &str = "base";

/// A file mode (permission and setuid/setgid/sticky bits), written as an
/// octal string `"0755"` or a TOML integer (`0o755`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mode(pub u32);

impl<'de> Deserialize<'de> for Mode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u32),
            Str(String),
        }
        let v = match Raw::deserialize(d)? {
            Raw::Int(i) => i,
            Raw::Str(s) => u32::from_str_radix(s.trim_start_matches("0o"), 8).map_err(|_| {
                serde::de::Error::custom(format!("mode {s:?}: expected octal like \"0755\""))
            })?,
        };
        if v > 0o7777 {
            return Err(serde::de::Error::custom(format!(
                "mode {v:o}: only permission and setuid/setgid/sticky bits (at most 07777)"
            )));
        }
        Ok(Mode(v))
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}

/// Layer compression. gzip is the default because umoci 0.4 cannot read
/// zstd layers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerCompression {
    #[default]
    Gzip,
    Zstd,
}

/// A sha256 per architecture.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchPins {
    pub amd64: Option<Digest>,
    pub arm64: Option<Digest>,
}

impl ArchPins {
    pub fn get(&self, arch: &str) -> Option<Digest> {
        match arch {
            "amd64" => self.amd64,
            "arm64" => self.arm64,
            _ => None,
        }
    }
}

/// The recipe file as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecipeFile {
    pub name: String,
    pub tag: String,
    pub platforms: Vec<String>,
    pub source_date_epoch: u64,
    #[serde(default)]
    pub compression: LayerCompression,
    #[serde(default)]
    pub description: Option<String>,
    /// Extra manifest annotations (`org.opencontainers.image.source`, …).
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    pub base: BaseSpec,
    #[serde(default)]
    pub components: BTreeMap<String, ComponentSpec>,
    #[serde(default)]
    pub downloads: DownloadsSpec,
    #[serde(default)]
    pub files: Vec<FileSpec>,
    #[serde(default)]
    pub units: UnitsSpec,
    /// `[[images]]`: container images baked in as archives for the node's
    /// containerd (the pause image, so the first pod needs no registry).
    #[serde(default)]
    pub images: Vec<ImageSpec>,
    pub layers: Vec<LayerSpec>,
}

/// Where baked container images live in the node image: per `[[images]]`
/// entry an OCI archive `<slug>.oci.tar` (the pinned image, this platform's
/// blobs only, named for containerd by an `io.containerd.image.name`
/// annotation) and `<slug>.image` (`NAME=` and `DIGEST=` lines), which the
/// image's import unit reads.
pub const IMAGES_DIR: &str = "/usr/lib/kubeslot/images";

/// `[[images]]`: one container image, pinned by digest.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageSpec {
    /// The reference containerd knows it by, with a tag
    /// (`registry.k8s.io/pause:3.10.2`): what the sandbox image setting or a
    /// pod names.
    pub name: String,
    /// Where to fetch it from, when not from `name`'s registry: a registry
    /// reference, `oci:DIR[:TAG]` or `oci-archive:FILE[:TAG]` (paths
    /// relative to the recipe).
    #[serde(default)]
    pub source: Option<String>,
    /// The digest the image (its index or manifest) must have.
    pub digest: Digest,
    /// The layer group the archive goes into.
    pub group: String,
}

impl ImageSpec {
    /// `name` parsed (validated by [`Recipe::parse`]).
    pub fn reference(&self) -> kubeslot_image::ImageRef {
        self.name.parse().expect("validated")
    }

    /// File name stem inside [`IMAGES_DIR`]: the normalised name with
    /// `/` and `:` as `_`.
    pub fn slug(&self) -> String {
        self.reference().to_string().replace(['/', ':'], "_")
    }

    /// Where to fetch from: `source`, else `name` (a registry).
    pub fn source(&self) -> Result<ImageSource, String> {
        self.source
            .as_deref()
            .unwrap_or(&self.name)
            .parse::<ImageSource>()
            .map_err(|e| e.to_string())
    }
}

/// `[base]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum BaseSpec {
    /// An existing OCI image pinned by its index or manifest digest.
    Image(ImageBase),
    /// A rootfs tarball per architecture pinned by sha256.
    Rootfs(RootfsBase),
    /// A Debian-family package set (see `crate::debian`).
    Debian(DebianBase),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageBase {
    /// `oci:DIR[:TAG]`, `oci-archive:FILE[:TAG]` or `REGISTRY/REPO[:TAG]`.
    pub image: String,
    /// The digest the image (index or manifest) must have.
    pub digest: Digest,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RootfsBase {
    /// URL template with `{arch}` (a `.tar`, `.tar.gz` or `.tar.zst`).
    pub url: String,
    pub sha256: ArchPins,
}

/// How a component is shipped upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum Format {
    #[serde(rename = "binary")]
    Binary,
    #[serde(rename = "tar.gz")]
    TarGz,
}

/// `[components.<name>]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComponentSpec {
    pub version: String,
    /// Upstream URL template with `{version}` and `{arch}`.
    pub url: String,
    pub sha256: ArchPins,
    pub format: Format,
    /// The layer group this component goes into.
    pub group: String,
    /// For `binary`: the in-image path.
    #[serde(default)]
    pub dest: Option<String>,
    /// For `binary`: the mode (default 0755).
    #[serde(default)]
    pub mode: Option<Mode>,
    /// For `tar.gz`: which members go where.
    #[serde(default)]
    pub extract: Vec<ExtractSpec>,
}

/// One extraction rule of an archive component.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtractSpec {
    /// Member pattern; `*` matches within one path segment (`bin/*`).
    pub from: String,
    /// In-image destination: a directory when it ends with `/`, else a file.
    pub to: String,
    #[serde(default)]
    pub mode: Option<Mode>,
}

/// `[downloads]`: where to fetch from instead of upstream.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DownloadsSpec {
    /// Replaces the scheme and host of every `http(s)` upstream URL; the
    /// path is kept (`https://dl.k8s.io/release/…` → `BASE/release/…`).
    /// A value without a scheme is a directory relative to the recipe.
    #[serde(default)]
    pub base_url: Option<String>,
    /// A whole URL template for every component: `{name}`, `{version}`,
    /// `{arch}`, `{file}` (upstream file name), `{path}` (upstream path).
    #[serde(default)]
    pub url_template: Option<String>,
    /// Per-component URL templates (`{version}`, `{arch}`).
    #[serde(default)]
    pub overrides: BTreeMap<String, String>,
}

/// `[[files]]`: a file baked into the image.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSpec {
    /// Absolute in-image path.
    pub path: String,
    /// A file relative to the recipe.
    #[serde(default)]
    pub source: Option<PathBuf>,
    /// Inline content.
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub mode: Option<Mode>,
    pub group: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnitsSpec {
    #[serde(default)]
    pub enable: Vec<UnitEnable>,
}

/// `systemctl enable`, at build time.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnitEnable {
    pub unit: String,
    pub wanted_by: String,
}

/// `[[layers]]`: the groups in layer order, base first.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerSpec {
    pub group: String,
    #[serde(default)]
    pub description: Option<String>,
}

/// Download overrides from the command line (win over the recipe's).
#[derive(Clone, Debug, Default)]
pub struct CliDownloads {
    /// `--download-base URL`.
    pub base_url: Option<String>,
    /// `--download-override NAME=URL` (NAME is a component or `base`).
    pub overrides: BTreeMap<String, String>,
}

/// A parsed and validated recipe.
#[derive(Clone, Debug)]
pub struct Recipe {
    pub path: PathBuf,
    pub dir: PathBuf,
    pub file: RecipeFile,
    pub platforms: Vec<Platform>,
}

/// What an input is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InputKind {
    BaseRootfs,
    Component(String),
}

/// One pinned download for one platform, with the URL it would have had
/// without overrides (for the plan and the SBOM).
#[derive(Clone, Debug)]
pub struct Input {
    pub kind: InputKind,
    pub upstream: String,
    pub pinned: Pinned,
}

impl Recipe {
    /// Human list of what goes into a group.
    pub fn layer_contents(&self, group: &str) -> Vec<String> {
        let f = &self.file;
        if group == BASE_GROUP {
            return vec![match &f.base {
                BaseSpec::Image(i) => format!("image {}@{}", i.image, i.digest),
                BaseSpec::Rootfs(r) => format!("rootfs {}", r.url),
                BaseSpec::Debian(d) => format!("debian {}", d.suite),
            }];
        }
        let mut out: Vec<String> = f
            .components
            .iter()
            .filter(|(_, c)| c.group == group)
            .map(|(n, c)| format!("{n} {}", c.version))
            .collect();
        out.extend(
            f.files
                .iter()
                .filter(|x| x.group == group)
                .map(|x| x.path.clone()),
        );
        for u in &f.units.enable {
            if self.unit_file(&u.unit).is_some_and(|x| x.group == group) {
                out.push(format!("enable {} (wanted by {})", u.unit, u.wanted_by));
            }
        }
        for i in f.images.iter().filter(|i| i.group == group) {
            out.push(format!("image {}@{}", i.name, i.digest));
        }
        out
    }

    /// Reads, parses and validates `path`.
    pub fn load(path: &Path) -> Result<Recipe, RecipeError> {
        let text = std::fs::read_to_string(path).map_err(|source| RecipeError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parses and validates `text` as if read from `path` (relative sources
    /// resolve against its directory).
    pub fn parse(path: &Path, text: &str) -> Result<Recipe, RecipeError> {
        let file: RecipeFile = toml::from_str(text).map_err(|e| RecipeError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })?;
        let dir = absolute(path.parent().unwrap_or(Path::new(".")));
        let invalid = |at: &str, rule: String| RecipeError::Invalid {
            path: path.to_path_buf(),
            at: at.to_string(),
            rule,
        };
        let mut platforms = Vec::new();
        for p in &file.platforms {
            let platform: Platform = p
                .parse()
                .map_err(|e| invalid("platforms", format!("{e}")))?;
            if platforms.contains(&platform) {
                return Err(invalid("platforms", format!("{p} is listed twice")));
            }
            platforms.push(platform);
        }
        if platforms.is_empty() {
            return Err(invalid(
                "platforms",
                "at least one platform is required".into(),
            ));
        }
        let recipe = Recipe {
            path: path.to_path_buf(),
            dir,
            file,
            platforms,
        };
        recipe.validate()?;
        Ok(recipe)
    }

    fn invalid(&self, at: &str, rule: impl Into<String>) -> RecipeError {
        RecipeError::Invalid {
            path: self.path.clone(),
            at: at.to_string(),
            rule: rule.into(),
        }
    }

    fn validate(&self) -> Result<(), RecipeError> {
        let f = &self.file;
        if f.name.is_empty() || f.tag.is_empty() {
            return Err(self.invalid("name/tag", "name and tag must not be empty"));
        }
        // Layers: unique, base first, every group used and every used group listed.
        let layer_groups: Vec<&str> = f.layers.iter().map(|l| l.group.as_str()).collect();
        if layer_groups.first() != Some(&BASE_GROUP) {
            return Err(self.invalid(
                "layers",
                format!("the first layer must be group {BASE_GROUP:?}"),
            ));
        }
        let mut seen = BTreeSet::new();
        for g in &layer_groups {
            if !seen.insert(*g) {
                return Err(self.invalid("layers", format!("group {g:?} is listed twice")));
            }
        }
        let mut used: BTreeSet<&str> = BTreeSet::new();
        used.insert(BASE_GROUP);
        for (name, c) in &f.components {
            self.check_component(name, c, &seen)?;
            used.insert(&c.group);
        }
        for name in f.downloads.overrides.keys() {
            if !f.components.contains_key(name) && name != "base" {
                return Err(self.invalid(
                    &format!("downloads.overrides.{name}"),
                    "names no component (or base)",
                ));
            }
        }
        if let Some(t) = &f.downloads.url_template {
            check_template(t, &["name", "version", "arch", "file", "path"])
                .map_err(|r| self.invalid("downloads.url_template", r))?;
        }
        self.check_base()?;
        let mut paths = BTreeSet::new();
        for (i, file) in f.files.iter().enumerate() {
            self.check_file(i, file, &seen, &mut paths)?;
            used.insert(&file.group);
        }
        let mut names = BTreeSet::new();
        for (i, img) in f.images.iter().enumerate() {
            self.check_image(i, img, &seen, &mut names)?;
            used.insert(&img.group);
        }
        for (i, u) in f.units.enable.iter().enumerate() {
            let at = format!("units.enable[{i}] ({})", u.unit);
            if self.unit_file(&u.unit).is_none() {
                return Err(self.invalid(
                    &at,
                    "the unit is not baked by a [[files]] entry under /etc/systemd/system or /usr/lib/systemd/system",
                ));
            }
            if u.wanted_by.contains('/') || !u.wanted_by.contains('.') {
                return Err(
                    self.invalid(&at, "wanted_by must be a unit name like multi-user.target")
                );
            }
        }
        for g in &layer_groups {
            if !used.contains(g) {
                return Err(self.invalid("layers", format!("group {g:?} has no content")));
            }
        }
        Ok(())
    }

    /// One `[components.NAME]`: its group, URL template, a pin for every
    /// platform, and the fields of its format.
    fn check_component(
        &self,
        name: &str,
        c: &ComponentSpec,
        seen: &BTreeSet<&str>,
    ) -> Result<(), RecipeError> {
        let at = format!("components.{name}");
        self.check_group(&at, &c.group, seen)?;
        check_template(&c.url, &["version", "arch"])
            .map_err(|r| self.invalid(&format!("{at}.url"), r))?;
        for p in &self.platforms {
            if c.sha256.get(&p.architecture).is_none() {
                return Err(self.invalid(
                    &format!("{at}.sha256.{}", p.architecture),
                    format!(
                        "no sha256 pin for {p}, which the recipe builds (every input must be pinned)"
                    ),
                ));
            }
        }
        match c.format {
            Format::Binary => {
                let dest = c.dest.as_deref().ok_or_else(|| {
                    self.invalid(&format!("{at}.dest"), "a binary component needs dest")
                })?;
                image_path(dest).map_err(|r| self.invalid(&format!("{at}.dest"), r))?;
                if !c.extract.is_empty() {
                    return Err(self.invalid(
                        &format!("{at}.extract"),
                        "extract is for tar.gz components; a binary has dest",
                    ));
                }
            }
            Format::TarGz => {
                if c.extract.is_empty() {
                    return Err(self.invalid(
                        &format!("{at}.extract"),
                        "a tar.gz component needs at least one extract rule",
                    ));
                }
                if c.dest.is_some() || c.mode.is_some() {
                    return Err(self.invalid(
                        &at,
                        "dest and mode are for binary components; use extract rules",
                    ));
                }
                for (i, x) in c.extract.iter().enumerate() {
                    image_path(&x.to)
                        .map_err(|r| self.invalid(&format!("{at}.extract[{i}].to"), r))?;
                    if x.from.is_empty() || x.from.starts_with('/') || x.from.contains("..") {
                        return Err(self.invalid(
                            &format!("{at}.extract[{i}].from"),
                            "a relative member pattern without ..",
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// `[base]`: a rootfs URL template pinned for every platform, an image
    /// source that parses, or a package base's own rules.
    fn check_base(&self) -> Result<(), RecipeError> {
        match &self.file.base {
            BaseSpec::Rootfs(r) => {
                check_template(&r.url, &["arch"]).map_err(|e| self.invalid("base.url", e))?;
                for p in &self.platforms {
                    if r.sha256.get(&p.architecture).is_none() {
                        return Err(self.invalid(
                            &format!("base.sha256.{}", p.architecture),
                            format!("no sha256 pin for {p}, which the recipe builds"),
                        ));
                    }
                }
            }
            BaseSpec::Image(i) => {
                i.image
                    .parse::<ImageSource>()
                    .map_err(|e| self.invalid("base.image", e.to_string()))?;
            }
            BaseSpec::Debian(d) => {
                d.check().map_err(|rule| self.invalid("base", rule))?;
            }
        }
        Ok(())
    }

    /// `files[i]`: its group, an in-image path baked once (`paths`), and
    /// exactly one of a source file or inline content.
    fn check_file(
        &self,
        i: usize,
        file: &FileSpec,
        seen: &BTreeSet<&str>,
        paths: &mut BTreeSet<String>,
    ) -> Result<(), RecipeError> {
        let at = format!("files[{i}] ({})", file.path);
        self.check_group(&at, &file.group, seen)?;
        let p = image_path(&file.path).map_err(|r| self.invalid(&at, r))?;
        if !paths.insert(p) {
            return Err(self.invalid(&at, "the path is baked twice"));
        }
        match (&file.source, &file.content) {
            (Some(src), None) => {
                let full = normalise(&self.dir.join(src));
                if !full.is_file() {
                    return Err(
                        self.invalid(&at, format!("source {} is not a file", full.display()))
                    );
                }
            }
            (None, Some(_)) => {}
            _ => return Err(self.invalid(&at, "exactly one of source or content")),
        }
        Ok(())
    }

    /// `images[i]`: its group, a tagged reference without a digest, listed
    /// once (`names`), and a source that parses.
    fn check_image(
        &self,
        i: usize,
        img: &ImageSpec,
        seen: &BTreeSet<&str>,
        names: &mut BTreeSet<String>,
    ) -> Result<(), RecipeError> {
        let at = format!("images[{i}] ({})", img.name);
        self.check_group(&at, &img.group, seen)?;
        let r: kubeslot_image::ImageRef = img
            .name
            .parse()
            .map_err(|e| self.invalid(&format!("{at}.name"), format!("{e}")))?;
        // written out, not defaulted: `latest` is no pin for a name
        let tagged = img.name.rsplit('/').next().is_some_and(|l| l.contains(':'));
        if !tagged || r.tag.is_none() || r.digest.is_some() {
            return Err(self.invalid(
                &format!("{at}.name"),
                "a reference with a tag and without a digest (the digest is pinned in `digest`)",
            ));
        }
        if !names.insert(r.to_string()) {
            return Err(self.invalid(&at, "the image is listed twice"));
        }
        img.source()
            .map_err(|e| self.invalid(&format!("{at}.source"), e))?;
        Ok(())
    }

    fn check_group(
        &self,
        at: &str,
        group: &str,
        groups: &BTreeSet<&str>,
    ) -> Result<(), RecipeError> {
        if group == BASE_GROUP {
            return Err(self.invalid(at, "group \"base\" holds only the base rootfs"));
        }
        if !groups.contains(group) {
            return Err(self.invalid(at, format!("group {group:?} is not listed in [[layers]]")));
        }
        Ok(())
    }

    /// The `[[files]]` entry that bakes unit `name`, if any.
    pub fn unit_file(&self, name: &str) -> Option<&FileSpec> {
        self.file.files.iter().find(|f| {
            [
                "/etc/systemd/system/",
                "/usr/lib/systemd/system/",
                "/lib/systemd/system/",
            ]
            .iter()
            .any(|d| f.path.strip_prefix(d) == Some(name))
        })
    }

    /// The pinned downloads of `platform`, overrides applied, in a stable
    /// order (base first, then components by name). Errors before anything
    /// is downloaded when an input has no pin.
    pub fn inputs(
        &self,
        platform: &Platform,
        cli: &CliDownloads,
    ) -> Result<Vec<Input>, RecipeError> {
        let arch = platform.architecture.as_str();
        let mut out = Vec::new();
        if let BaseSpec::Rootfs(r) = &self.file.base {
            let upstream = r.url.replace("{arch}", arch);
            let sha = r.sha256.get(arch).ok_or_else(|| {
                self.invalid(
                    &format!("base.sha256.{arch}"),
                    format!("no sha256 pin for {platform}"),
                )
            })?;
            let url = self.resolve_url("base", None, &upstream, arch, cli);
            out.push(Input {
                kind: InputKind::BaseRootfs,
                upstream,
                pinned: Pinned {
                    url,
                    sha256: sha,
                    size: None,
                    label: format!("base rootfs {platform}"),
                },
            });
        }
        for (name, c) in &self.file.components {
            let upstream = c
                .url
                .replace("{version}", &c.version)
                .replace("{arch}", arch);
            let sha = c.sha256.get(arch).ok_or_else(|| {
                self.invalid(
                    &format!("components.{name}.sha256.{arch}"),
                    format!("no sha256 pin for {platform}"),
                )
            })?;
            let url = self.resolve_url(name, Some(&c.version), &upstream, arch, cli);
            out.push(Input {
                kind: InputKind::Component(name.clone()),
                upstream,
                pinned: Pinned {
                    url,
                    sha256: sha,
                    size: None,
                    label: format!("{name} {} {platform}", c.version),
                },
            });
        }
        Ok(out)
    }

    /// Applies, in order of precedence: the CLI per-input override, the
    /// recipe's per-input override, the CLI base URL, the recipe's URL
    /// template, the recipe's base URL, the upstream URL. Relative paths
    /// resolve against the recipe's directory.
    fn resolve_url(
        &self,
        name: &str,
        version: Option<&str>,
        upstream: &str,
        arch: &str,
        cli: &CliDownloads,
    ) -> String {
        let fill = |t: &str| {
            t.replace("{version}", version.unwrap_or(""))
                .replace("{arch}", arch)
                .replace("{name}", name)
        };
        let d = &self.file.downloads;
        if let Some(t) = cli.overrides.get(name).or_else(|| d.overrides.get(name)) {
            return self.to_url(&fill(t));
        }
        let upstream_url = self.to_url(upstream);
        let remote = reqwest::Url::parse(&upstream_url)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"));
        let Some(remote) = remote else {
            return upstream_url;
        };
        let rebase = |base: &str| {
            format!(
                "{}{}",
                self.to_url(base).trim_end_matches('/'),
                remote.path()
            )
        };
        if let Some(b) = &cli.base_url {
            return rebase(b);
        }
        if let Some(t) = &d.url_template {
            let file = remote.path().rsplit('/').next().unwrap_or("");
            return self.to_url(
                &fill(t)
                    .replace("{file}", file)
                    .replace("{path}", remote.path().trim_start_matches('/')),
            );
        }
        if let Some(b) = &d.base_url {
            return rebase(b);
        }
        upstream_url
    }

    /// A URL as written, or a path (relative to the recipe) as a `file://` URL.
    fn to_url(&self, s: &str) -> String {
        if s.contains("://") {
            return s.to_string();
        }
        let p = normalise(&self.dir.join(s));
        let mut url = reqwest::Url::from_file_path(&p)
            .map(|u| u.to_string())
            .unwrap_or_else(|()| format!("file://{}", p.display()));
        if s.ends_with('/') && !url.ends_with('/') {
            url.push('/');
        }
        url
    }

    /// The in-image version annotations (`dev.kubeslot.version.<name>`).
    pub fn versions(&self) -> BTreeMap<String, String> {
        self.file
            .components
            .iter()
            .map(|(n, c)| (n.clone(), c.version.clone()))
            .collect()
    }
}

/// Checks that `{…}` placeholders in `t` are among `allowed`.
fn check_template(t: &str, allowed: &[&str]) -> Result<(), String> {
    let mut rest = t;
    while let Some(start) = rest.find('{') {
        let end = rest[start..]
            .find('}')
            .ok_or_else(|| format!("unclosed placeholder in {t:?}"))?;
        let name = &rest[start + 1..start + end];
        if !allowed.contains(&name) {
            return Err(format!(
                "unknown placeholder {{{name}}} in {t:?} (allowed: {})",
                allowed
                    .iter()
                    .map(|a| format!("{{{a}}}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        rest = &rest[start + end + 1..];
    }
    Ok(())
}

/// Checks an absolute in-image path and returns it without the leading `/`
/// (a trailing `/` is kept: it marks a directory destination).
pub fn image_path(p: &str) -> Result<String, String> {
    let Some(rel) = p.strip_prefix('/') else {
        return Err(format!("{p:?} must be an absolute in-image path"));
    };
    let trimmed = rel.trim_end_matches('/');
    if trimmed.is_empty()
        || trimmed
            .split('/')
            .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Err(format!(
            "{p:?}: empty, . or .. path segments are not allowed"
        ));
    }
    Ok(rel.to_string())
}

fn absolute(p: &Path) -> PathBuf {
    let p = if p.as_os_str().is_empty() {
        Path::new(".")
    } else {
        p
    };
    normalise(&std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf()))
}

/// Removes `.` and resolves `..` lexically.
fn normalise(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    fn recipe(extra: &str) -> String {
        format!(
            r#"
name = "t"
tag = "1"
platforms = ["linux/amd64", "linux/arm64"]
source_date_epoch = 1700000000
[base]
kind = "rootfs"
url = "https://example.invalid/base-{{arch}}.tar.gz"
sha256 = {{ amd64 = "{SHA}", arm64 = "{SHA}" }}
[components.kubelet]
version = "1.36.4"
url = "https://dl.k8s.io/release/v{{version}}/bin/linux/{{arch}}/kubelet"
sha256 = {{ amd64 = "{SHA}", arm64 = "{SHA}" }}
format = "binary"
dest = "/usr/local/bin/kubelet"
group = "kubernetes"
[[layers]]
group = "base"
[[layers]]
group = "kubernetes"
{extra}
"#
        )
    }

    #[test]
    fn parses_and_resolves_overrides() {
        let r = Recipe::parse(Path::new("/r/x.toml"), &recipe("")).unwrap();
        let p = Platform::linux("arm64");
        let ins = r.inputs(&p, &CliDownloads::default()).unwrap();
        assert_eq!(
            ins[1].pinned.url,
            "https://dl.k8s.io/release/v1.36.4/bin/linux/arm64/kubelet"
        );
        let cli = CliDownloads {
            base_url: Some("http://127.0.0.1:9/m/".into()),
            ..Default::default()
        };
        let ins = r.inputs(&p, &cli).unwrap();
        assert_eq!(
            ins[1].pinned.url,
            "http://127.0.0.1:9/m/release/v1.36.4/bin/linux/arm64/kubelet"
        );
        assert_eq!(ins[0].pinned.url, "http://127.0.0.1:9/m/base-arm64.tar.gz");
        let mut cli = CliDownloads::default();
        cli.overrides.insert(
            "kubelet".into(),
            "../mirror/kubelet-{version}-{arch}".into(),
        );
        let ins = r.inputs(&p, &cli).unwrap();
        assert_eq!(ins[1].pinned.url, "file:///mirror/kubelet-1.36.4-arm64");
    }

    #[test]
    fn unknown_field_names_line() {
        let e = Recipe::parse(Path::new("x.toml"), &recipe("bogus = 1"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("x.toml") && e.contains("bogus") && e.contains("line"),
            "{e}"
        );
    }

    #[test]
    fn missing_pin_is_an_error() {
        let text = recipe("").replacen(&format!(", arm64 = \"{SHA}\" }}\nformat"), " }\nformat", 1);
        let e = Recipe::parse(Path::new("x.toml"), &text)
            .unwrap_err()
            .to_string();
        assert!(e.contains("components.kubelet.sha256.arm64"), "{e}");
    }

    #[test]
    fn image_paths() {
        assert!(image_path("/usr/local/bin/").is_ok());
        for bad in ["usr/bin", "/", "/a/../b", "/a//b"] {
            assert!(image_path(bad).is_err(), "{bad}");
        }
    }
}
