//! The files directory keeps every file inside it: names that break a rule never reach it,
//! and names that pass, or symbolic links placed in it, never lead outside.

use std::path::Path;

use linkbus_file::CapFilesDir;
use linkbus_plugin_api::{FileName, FilesDir};
use proptest::prelude::*;

/// A files directory and, beside it, a canary directory that must stay as it is.
fn setup() -> (tempfile::TempDir, CapFilesDir) {
    let top = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(top.path().join("canary")).expect("canary");
    std::fs::write(top.path().join("canary/keep"), b"canary").expect("canary file");
    let dir = CapFilesDir::open(&top.path().join("files")).expect("opens");
    (top, dir)
}

fn canary_untouched(top: &Path) {
    let entries: Vec<_> = std::fs::read_dir(top.join("canary")).expect("canary").collect();
    assert_eq!(entries.len(), 1, "the canary directory changed");
    assert_eq!(std::fs::read(top.join("canary/keep")).expect("keep"), b"canary");
    let names: Vec<_> = std::fs::read_dir(top).expect("top").map(|e| e.expect("entry").file_name()).collect();
    assert_eq!(names.len(), 2, "something was made beside the files directory: {names:?}");
}

/// Writes `bytes` as partial `id` and publishes it as `name`.
fn receive(dir: &CapFilesDir, id: &str, name: &FileName, bytes: &[u8]) -> std::io::Result<()> {
    let partial = dir.partial(id, true)?;
    partial.write_at(0, bytes)?;
    partial.sync()?;
    dir.publish(id, name)
}

#[test]
fn a_file_is_received_sent_and_removed_by_name() {
    let (top, dir) = setup();
    let name = FileName::new("reports/q3 summary.pdf").expect("name");
    receive(&dir, "A-1-inbox", &name, b"the report").expect("published");
    assert_eq!(std::fs::read(top.path().join("files/reports/q3 summary.pdf")).expect("there"), b"the report");
    assert!(dir.partials().expect("listed").is_empty(), "the partial was moved");
    let source = dir.open_source(&name).expect("opens");
    assert_eq!(source.stamp().expect("stamp").size, 10);
    let mut buf = [0; 6];
    assert_eq!(source.read_at(4, &mut buf).expect("reads"), 6);
    assert_eq!(&buf, b"report");
    assert!(dir.exists(&name).expect("exists"));
    dir.remove(&name).expect("removed");
    assert!(!dir.exists(&name).expect("gone"));
    canary_untouched(top.path());
}

#[test]
fn publishing_never_replaces_a_file() {
    let (top, dir) = setup();
    let name = FileName::new("x.bin").expect("name");
    std::fs::write(top.path().join("files/x.bin"), b"old").expect("old");
    let error = receive(&dir, "A-2-q", &name, b"new").expect_err("refused");
    assert_eq!(error.kind(), std::io::ErrorKind::AlreadyExists);
    assert_eq!(std::fs::read(top.path().join("files/x.bin")).expect("old"), b"old");
    assert_eq!(dir.partials().expect("listed"), ["A-2-q"], "the partial stays");
}

#[test]
fn symbolic_links_out_of_the_directory_are_not_followed() {
    let (top, dir) = setup();
    std::os::unix::fs::symlink(top.path().join("canary"), top.path().join("files/out")).expect("link");
    std::os::unix::fs::symlink(top.path().join("canary/keep"), top.path().join("files/keep")).expect("link");
    let into_link = FileName::new("out/new").expect("name");
    assert!(receive(&dir, "A-3-q", &into_link, b"escaped").is_err(), "wrote through a link");
    assert!(dir.open_source(&FileName::new("keep").expect("name")).is_err(), "read through a link");
    assert!(dir.open_source(&FileName::new("out/keep").expect("name")).is_err(), "read through a link");
    assert!(dir.partial("../x", true).is_err() && dir.partial(".hidden", true).is_err());
    canary_untouched(top.path());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Random segments, dots, slashes and backslashes included: a name either breaks a rule
    /// or lands inside the files directory; the canary beside it never changes.
    #[test]
    fn random_names_stay_inside(parts in proptest::collection::vec("(\\.\\.|\\.|canary|files|[a-z ]{1,4}|/|\\\\)", 1..7)) {
        let (top, dir) = setup();
        let name = parts.concat();
        if let Ok(name) = FileName::new(&name) {
            let _ = receive(&dir, "A-9-q", &name, b"payload");
            if dir.exists(&name).unwrap_or(false) {
                let landed = top.path().join("files").join(name.as_str());
                prop_assert!(landed.starts_with(top.path().join("files")));
                prop_assert_eq!(std::fs::read(&landed).expect("reads"), b"payload");
            }
        }
        canary_untouched(top.path());
    }
}
