//! Native plugin libraries on real node processes: the `sqlite` store, loaded from its
//! library by path with a SHA-256 pin, serves two nodes over Noise while either is killed
//! with SIGKILL, and keeps a lone node's persistent messages; `linkbus plugins` says where
//! every plugin came from; wrong libraries are refused with the YAML path and the reason;
//! a store that panics stops its node, which says why.

use crate::support;

use std::path::{Path, PathBuf};

use support::soak::Soak;
use support::{Scratch, stderr, stdout};

use crate::durability::{put_lines, random_kills_of_either_node};

/// A plugin library the test build made: a crate's own (in `deps`, as this test binary) or
/// an example's.
pub(crate) fn built_library(file: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("target/PROFILE/deps");
    let path = if file.starts_with("libfixture_") {
        deps.parent().expect("target/PROFILE").join("examples").join(file)
    } else {
        deps.join(file)
    };
    assert!(path.exists(), "{} is missing: `cargo test --workspace` builds it", path.display());
    path
}

fn sqlite() -> PathBuf {
    built_library("liblinkbus_store_sqlite.so")
}

fn sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).expect("read library");
    let digest = <sha2::Sha256 as sha2::Digest>::digest(&bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn the_sqlite_library_serves_two_nodes_through_random_kill_9s() {
    let library = sqlite();
    let store = format!("sqlite, library: '{}', sha256: '{}'", library.display(), sha256(&library));
    random_kills_of_either_node(&mut Soak::new(8), &store);
}

#[test]
fn persistent_messages_survive_kill_9_on_the_sqlite_store_and_plugins_says_where_it_came_from() {
    let s = Scratch::new();
    let library = sqlite();
    let digest = sha256(&library);
    let config = s.write(
        "a.yaml",
        &format!(
            "node: {{ name: A, listen: none }}\nqueues: [ {{ name: q, order: fifo }} ]\n\
             plugins: {{ store: {{ kind: sqlite, library: '{}', sha256: '{digest}', cache_mib: 4 }} }}\n",
            library.display()
        ),
    );
    let config = config.to_str().unwrap();
    let mut a = s.start_node("A", &["-c", config]);
    let lines: String = (1..=2000).map(|n| format!("p{n:04} {}\n", "x".repeat(200))).collect();
    put_lines(&s, "A:q", &lines, "--persistent");
    put_lines(&s, "A:q", "v1\nv2\n", "--volatile");
    a.kill();

    let _a = s.start_node("A", &["-c", config]);
    let status = stdout(&s.run(&["status", "--node", "A"]));
    assert!(status.contains("store: sqlite (durable: true)"), "{status}");
    let plugins = stdout(&s.run(&["plugins", "--node", "A"]));
    let canonical = library.canonicalize().unwrap();
    let row = plugins.lines().find(|l| l.starts_with("store") && l.contains("sqlite")).expect("a sqlite row");
    assert!(
        row.contains(" yes ") && row.contains(&format!("library {} sha256 {digest}", canonical.display())),
        "{plugins}"
    );
    assert!(plugins.lines().any(|l| l.starts_with("store") && l.contains("fjall") && l.contains("built in")));
    let got = stdout(&s.run(&["get", "--node", "A", "q", "--count", "3000", "--wait", "1s"]));
    assert_eq!(got, lines, "every persistent message, in order, and no volatile one");
    assert!(s.path().join("linkbus-data/A/store.sqlite").exists(), "the database is in the data directory");

    // The same listing from the configuration alone, without a node.
    let offline = stdout(&s.run(&["plugins", "--config", config]));
    assert!(
        offline.lines().any(|l| l.starts_with("store") && l.contains("sqlite") && l.contains(&digest)),
        "{offline}"
    );
}

/// Each wrong library or section, through `config check` and a node's start: refused,
/// naming the YAML path and what was wrong.
#[test]
fn wrong_libraries_and_sections_are_refused_with_their_yaml_path() {
    let s = Scratch::new();
    let text = s.write("notes.so", "not a library\n");
    let library = sqlite();
    let cases: Vec<(String, String)> = vec![
        (
            format!("kind: sqlite, library: '{}', sha256: '{}'", library.display(), "0".repeat(64)),
            format!(
                "plugins.store.library: {} has SHA-256 {}, not the pinned",
                library.canonicalize().unwrap().display(),
                sha256(&library)
            ),
        ),
        (format!("kind: sqlite, library: '{}'", text.display()), "is not a loadable shared library".into()),
        (
            format!("kind: x, library: '{}'", built_library("libfixture_abi_v999.so").display()),
            "was built for native plugin ABI version 999, and this node loads version 1".into(),
        ),
        (
            format!("kind: x, library: '{}'", built_library("libfixture_no_root.so").display()),
            "has no plugin root module".into(),
        ),
        (
            format!("kind: sqlite, library: '{}/missing.so'", s.path().display()),
            "plugins.store.library: cannot read".into(),
        ),
        (
            format!("kind: sqlite3, library: '{}'", library.display()),
            "offers no store plugin named 'sqlite3'; its store plugins: sqlite".into(),
        ),
        (
            format!("kind: sqlite, library: '{}', colour: red", library.display()),
            "plugins.store.colour: unknown key".into(),
        ),
        (
            format!("kind: sqlite, library: '{}', cache_mib: lots", library.display()),
            "plugins.store.cache_mib: ".into(),
        ),
        (
            "kind: fjall, sha256: 'abc'".into(),
            "plugins.store.sha256: pins a native library: set `library:` too".into(),
        ),
        (
            format!("kind: sqlite, library: '{}', sha256: 'abc'", library.display()),
            "plugins.store.sha256: expected 64 hexadecimal digits".into(),
        ),
    ];
    for (i, (section, expected)) in cases.iter().enumerate() {
        let file = s.write(
            &format!("bad{i}.yaml"),
            &format!("node: {{ name: A, listen: none }}\nplugins: {{ store: {{ {section} }} }}\n"),
        );
        let check = s.run(&["config", "check", file.to_str().unwrap()]);
        assert!(!check.status.success(), "{section}: accepted");
        let said = format!("{}{}", stdout(&check), stderr(&check));
        assert!(said.contains(expected.as_str()), "{section}: {said}");
        let run = s.run(&["node", "run", "-c", file.to_str().unwrap()]);
        assert!(
            !run.status.success() && stderr(&run).contains(expected.as_str()),
            "{section}: {}",
            stderr(&run)
        );
    }
}

/// Native stages: a library on an extension point ABI 1 does not carry, and a compressor
/// after a cipher once the library's kinds are known, are refused with their paths.
#[test]
fn native_stages_are_checked_in_place() {
    let s = Scratch::new();
    let library = built_library("liblinkbus_native_fixtures.so");
    let library = library.display();
    let key = s.path().join("k.pkey");
    let made = s.run(&["keygen", "--payload", "--out", key.to_str().unwrap()]);
    assert!(made.status.success(), "{}", stderr(&made));
    let cases = [
        (
            format!("transport: {{ kind: tcp, library: '{library}' }}"),
            "plugins.transport.library: a native library can serve a store, a stage (compressor, cipher) or a filter, not a transport".to_owned(),
        ),
        (
            format!(
                "stages: [ {{ kind: chacha20poly1305, library: '{library}', rules: [ {{ to: '*', key: '{}' }} ] }},                  {{ kind: zstd, library: '{library}' }} ]",
                key.display()
            ),
            "plugins.stages[1].kind: compressor 'zstd' comes after cipher 'chacha20poly1305'".to_owned(),
        ),
        (format!("stages: [ {{ kind: lz4, library: '{library}' }} ]"), "offers no compressor or cipher plugin named 'lz4'; its compressor or cipher plugins: zstd, chacha20poly1305".to_owned()),
        (format!("stages: [ {{ kind: zstd, library: '{library}', level: 99 }} ]"), "plugins.stages[0].level: unknown key".to_owned()),
    ];
    for (i, (plugins, expected)) in cases.iter().enumerate() {
        let file = s.write(
            &format!("bad{i}.yaml"),
            &format!("node: {{ name: A, listen: none }}\nplugins: {{ {plugins} }}\n"),
        );
        let check = s.run(&["config", "check", file.to_str().unwrap()]);
        let said = format!("{}{}", stdout(&check), stderr(&check));
        assert!(!check.status.success() && said.contains(expected.as_str()), "{plugins}: {said}");
    }
}

/// A store whose plugin panics: the panic is caught at the boundary, the store is poisoned,
/// the put that needed it fails, and the node stops (exit status non-zero) saying why,
/// rather than acknowledge what it could not keep.
#[test]
fn a_store_that_panics_stops_its_node_which_says_why() {
    let s = Scratch::new();
    let fixture = built_library("liblinkbus_native_fixtures.so");
    let config = s.write(
        "a.yaml",
        &format!(
            "node: {{ name: A, listen: none }}\nqueues: [ {{ name: q, order: fifo }} ]\n\
             plugins: {{ store: {{ kind: fixture, library: '{}', panic_at_write: 5 }} }}\n",
            fixture.display()
        ),
    );
    let mut a = s.start_node("A", &["-c", config.to_str().unwrap()]);
    // One persistent put after another (each a synced write) until one meets the panic.
    let failed = (1..=40).find(|n| {
        let put = s.run(&["put", "--node", "A", "--to", "A:q", "--persistent", &format!("m{n}")]);
        !put.status.success()
    });
    assert!(failed.is_some(), "a put met the panic");
    let status = a.wait_exit(std::time::Duration::from_secs(10)).expect("the node stops");
    assert!(!status.success());
    let log = a.log_text();
    assert!(
        log.contains("the plugin panicked in write") && log.contains("told to panic at write 5"),
        "{log}"
    );
}

#[test]
fn the_walkthrough_in_docs_native_plugins_md_runs_as_written() {
    let s = Scratch::new();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    // The example as the repository holds it, its path dependencies made absolute (the
    // scratch directory is not inside the repository), with its lock file.
    let example = s.path().join("examples/native-plugin");
    std::fs::create_dir_all(example.join("src")).expect("examples/");
    for file in ["Cargo.lock", "src/lib.rs"] {
        std::fs::copy(repo.join("examples/native-plugin").join(file), example.join(file)).expect("copy");
    }
    let manifest = std::fs::read_to_string(repo.join("examples/native-plugin/Cargo.toml")).expect("manifest");
    let manifest = manifest.replace("\"../../", &format!("\"{}/", repo.display()));
    std::fs::write(example.join("Cargo.toml"), manifest).expect("manifest");

    let doc = std::fs::read_to_string(repo.join("docs/native-plugins.md")).expect("doc");
    // `linkbus` on PATH is the binary itself, so `kill %1` ends the node it started.
    let bin = s.path().join("bin");
    std::fs::create_dir_all(&bin).expect("bin/");
    std::os::unix::fs::symlink(support::linkbus_bin(), bin.join("linkbus")).expect("symlink");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut script = "set -eu\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n".to_owned();
    for block in doc.split("```sh\n").skip(1) {
        script.push_str(block.split("```").next().expect("a closed block"));
    }
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(s.path())
        .env("LINKBUS_RUNTIME_DIR", s.runtime_dir())
        .env("PATH", path)
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("bash runs");
    let said = stdout(&out) + &stderr(&out);
    assert!(out.status.success(), "{said}");
    let library =
        s.path().join("examples/my-store/target/release/libmy_store.so").canonicalize().expect("built");
    let digest = sha256(&library);
    for expected in [
        "node.yaml: ok".to_owned(),
        format!("tally             0.1.0    yes   library {} sha256 {digest}", library.display()),
        "plugins.store.max_keys: expected an integer, found a string".to_owned(),
        "{\"order\": 1}\n".to_owned(),
        "store: tally (durable: false)".to_owned(),
    ] {
        assert!(said.contains(&expected), "{expected:?} in {said}");
    }
    assert_eq!(said.matches(&format!("library {} sha256 {digest}", library.display())).count(), 2, "{said}");
}

/// A native filter (the fixture library's `drop-by-header`), taken up by `linkbus reload`
/// on a running node: it refuses what it drops at the origin, with its reason, counts in
/// `status`, and `linkbus plugins` names its library.
#[test]
fn a_native_filter_is_taken_up_by_reload_and_acts_on_a_running_node() {
    let s = Scratch::new();
    let library = built_library("liblinkbus_native_fixtures.so");
    let base = "node: { name: A, listen: none }\nqueues: [ { name: orders } ]\n";
    let config = s.write("a.yaml", base);
    let _a = s.start_node("A", &["-c", config.to_str().unwrap()]);
    let put = |env: &str, payload: &str| {
        s.run(&["put", "--node", "A", "--to", "A:orders", "--header", &format!("env={env}"), payload])
    };
    assert!(put("test", "before").status.success(), "no filter yet");

    s.write(
        "a.yaml",
        &format!(
            "{base}plugins:\n  filters:\n    - {{ name: no-test, kind: drop-by-header, library: '{}', \
             hooks: [on_send], key: env, value: test }}\n",
            library.display()
        ),
    );
    let reload = s.run(&["reload", "--node", "A"]);
    assert!(reload.status.success(), "{}{}", stdout(&reload), stderr(&reload));
    assert!(stdout(&reload).contains("filters reloaded: 1 running (0 kept, 1 new)"), "{}", stdout(&reload));

    let refused = put("test", "after");
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("filter 'no-test' dropped it at on_send: header env is test"),
        "{}",
        stderr(&refused)
    );
    assert!(put("prod", "passes").status.success());
    let got = stdout(&s.run(&["get", "--node", "A", "orders", "--count", "10", "--wait", "1s"]));
    assert_eq!(got, "before\npasses\n");

    let status = stdout(&s.run(&["status", "--node", "A"]));
    let line = status.lines().find(|l| l.starts_with("  no-test [")).unwrap_or_else(|| panic!("{status}"));
    assert!(line.contains("2 calls, 2 messages, 1 dropped"), "{status}");
    assert!(status.contains("dropped: 1"), "its own counter: {status}");
    let plugins = stdout(&s.run(&["plugins", "--node", "A"]));
    let canonical = library.canonicalize().unwrap();
    let row = plugins
        .lines()
        .find(|l| l.contains("no-test (drop-by-header)"))
        .unwrap_or_else(|| panic!("{plugins}"));
    assert!(row.contains(&format!("library {}", canonical.display())), "{plugins}");

    // A key the plugin does not know, through the plugin's own check, refuses the reload.
    s.write(
        "a.yaml",
        &format!(
            "{base}plugins:\n  filters:\n    - {{ name: no-test, kind: drop-by-header, library: '{}', \
             hooks: [on_send], key: env, value: test, colour: red }}\n",
            library.display()
        ),
    );
    let refused = s.run(&["reload", "--node", "A"]);
    let said = stdout(&refused) + &stderr(&refused);
    assert!(!refused.status.success() && said.contains("plugins.filters[0].colour: unknown key"), "{said}");
}
