//! TEST ONLY: signs an image in an OCI layout keylessly with a fresh test
//! Sigstore instance (`kubeslot_test_support::keyless::TestSigstore`), for
//! the end-to-end scenario `keyless_verified_offline` (ci/e2e/keyless.sh).
//!
//! ```text
//! kubeslot-test-sigstore --trusted-root FILE --repository NAME --layout DIR --tag TAG
//!                        [--mutation NAME --mutated-layout DIR]
//! ```
//!
//! Writes the instance's `trusted_root.json` to FILE; signs TAG of DIR
//! (the index and its platform manifests) both ways cosign does, naming
//! repository NAME, as the workflow `Workflow::example()`; with
//! `--mutation`, signs TAG of the second layout with that mutation of the
//! material (bundles only, so nothing else could pass). Prints the
//! certificate identity, issuer and signed digests as JSON.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use kubeslot_image::layout::Layout;
use kubeslot_test_support::keyless::sigstore::Mutation;
use kubeslot_test_support::keyless::{image_subjects, SignSpec, TestSigstore, Workflow};

fn main() -> ExitCode {
    let mut args: BTreeMap<String, String> = BTreeMap::new();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let Some(value) = it.next() else {
            eprintln!("error: {flag} needs a value");
            return ExitCode::from(2);
        };
        args.insert(flag, value);
    }
    let get = |k: &str| args.get(k).cloned();
    let (Some(root), Some(repository), Some(layout), Some(tag)) = (
        get("--trusted-root"),
        get("--repository"),
        get("--layout"),
        get("--tag"),
    ) else {
        eprintln!("usage: kubeslot-test-sigstore --trusted-root FILE --repository NAME --layout DIR --tag TAG [--mutation NAME --mutated-layout DIR]");
        return ExitCode::from(2);
    };
    let sigstore = TestSigstore::new();
    sigstore.write_trusted_root(&PathBuf::from(root));
    let workflow = Workflow::example();
    let spec = SignSpec::new(workflow.clone(), &repository);
    let layout = Layout::open(PathBuf::from(&layout)).expect("an OCI layout");
    let subjects = image_subjects(&layout, &tag);
    sigstore.sign(&subjects, &spec).attach(&layout);
    if let Some(name) = get("--mutation") {
        let Some(mutation) = Mutation::from_name(&name) else {
            let names: Vec<&str> = Mutation::ALL.iter().map(|m| m.name()).collect();
            eprintln!("error: unknown mutation {name} ({})", names.join(", "));
            return ExitCode::from(2);
        };
        let dir = get("--mutated-layout").expect("--mutated-layout with --mutation");
        let other = Layout::open(PathBuf::from(dir)).expect("an OCI layout");
        let mut bundles_only = spec.clone();
        bundles_only.legacy = false;
        sigstore
            .sign_mutated(&image_subjects(&other, &tag), &bundles_only, mutation)
            .attach(&other);
    }
    let out = serde_json::json!({
        "identity": workflow.identity(),
        "issuer": spec.leaf.issuer,
        "signed": subjects.iter().map(|s| s.digest.to_string()).collect::<Vec<_>>(),
    });
    println!("{out}");
    ExitCode::SUCCESS
}
