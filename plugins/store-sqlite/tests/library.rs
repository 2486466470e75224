//! The plugin as a node loads it: the library built by this crate, through the native
//! loader and the ABI, passes the store conformance kit, keeps synced data across reopens
//! and fails closed on a full disk.

use std::path::{Path, PathBuf};

use linkbus_plugin_api::registry::{BuildContext, Builder, Plugin};
use linkbus_plugin_api::{ConfigValue, NodeName, Store};

/// The library `cargo test` built beside this test (crate type `cdylib`, in `deps`).
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("target/PROFILE/deps");
    let path = deps.join("liblinkbus_store_sqlite.so");
    assert!(path.exists(), "{} is missing: `cargo test -p linkbus-store-sqlite` builds it", path.display());
    path
}

fn plugin() -> Plugin {
    let library = linkbus_native::load(&library(), None).expect("the library loads");
    let plugin =
        linkbus_native::plugins(&library).into_iter().find(|p| p.name == "sqlite").expect("offers sqlite");
    assert_eq!((plugin.kind(), plugin.version.as_str()), ("store", env!("CARGO_PKG_VERSION")));
    plugin
}

fn open(plugin: &Plugin, path: &Path) -> Box<dyn Store> {
    let Builder::Store(build) = &plugin.builder else { panic!("a store") };
    let section = ConfigValue::Map(vec![
        ("kind".into(), ConfigValue::Str("sqlite".into())),
        ("path".into(), ConfigValue::Str(path.to_string_lossy().into_owned())),
        ("cache_mib".into(), ConfigValue::Uint(1)),
    ]);
    let context = BuildContext { node: NodeName::new("A").expect("name"), data_dir: std::env::temp_dir() };
    build(&section, &context).expect("opens")
}

#[test]
fn through_the_library_it_passes_the_store_kit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = plugin();
    linkbus_plugin_api::testing::check_store(&*open(&plugin, &dir.path().join("kit.sqlite")));
    let path = dir.path().join("reopen.sqlite");
    linkbus_plugin_api::testing::check_store_reopens(&|| open(&plugin, &path));
}

/// On a 4 MiB tmpfs, mounted when the tests run as root (skipped, saying so, elsewhere).
#[test]
fn through_the_library_a_full_disk_poisons_it_and_loses_no_synced_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin = plugin();
    linkbus_plugin_api::testing::check_store_fails_closed_on_a_small_tmpfs(dir.path(), &|path| {
        open(&plugin, &path.join("s.sqlite"))
    });
}
