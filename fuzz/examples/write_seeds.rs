//! Writes the fuzz targets' seeds (real traffic and files, made by the code) into
//! `fuzz/corpus/TARGET/seed-NAME`: run it when a format changes.

fn main() -> std::io::Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let written = linkbus_fuzz::write_seeds(&root)?;
    println!("{written} seeds written under {}", root.display());
    Ok(())
}
