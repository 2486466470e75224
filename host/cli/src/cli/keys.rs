//! `linkbus keygen` (node keys, cluster keys, payload keys) and `linkbus zstd train`.

use anyhow::Context;

use super::{KeygenArgs, ZstdCommand};

/// Runs `linkbus keygen`.
///
/// # Errors
/// When the key cannot be made or written.
pub(crate) fn keygen(args: &KeygenArgs) -> anyhow::Result<()> {
    use linkbus_proto::secure::{Keypair, hex};
    if args.payload {
        let id = linkbus_encrypt_chacha::write_new_key_file(&args.out)
            .with_context(|| format!("writing {}", args.out.display()))?;
        println!("{}", hex(&id));
        eprintln!(
            "wrote a payload key to {} (mode 0600); the line above is its id, which travels with the messages sealed under it",
            args.out.display()
        );
        return Ok(());
    }
    let keys = Keypair::generate()?;
    let write = |key| {
        linkbus_host::security::write_key_file(&args.out, key)
            .with_context(|| format!("writing {}", args.out.display()))
    };
    if args.psk {
        write(&keys.private)?;
        println!("wrote a cluster pre-shared key to {} (give every node a copy)", args.out.display());
    } else {
        write(&keys.private)?;
        println!("{}", hex(&keys.public));
        eprintln!(
            "wrote the private key to {}; the line above is the public key for peers' configs",
            args.out.display()
        );
    }
    Ok(())
}

/// Runs `linkbus zstd ...`.
///
/// # Errors
/// When a sample cannot be read, training fails, or the dictionary cannot be written.
pub(crate) fn zstd(command: ZstdCommand) -> anyhow::Result<()> {
    let ZstdCommand::Train { out, size, lines, files } = command;
    let mut samples = Vec::new();
    for file in &files {
        let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        if lines {
            samples.extend(bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()).map(<[u8]>::to_vec));
        } else {
            samples.push(bytes);
        }
    }
    let dictionary = linkbus_compress_zstd::train(&samples, size).map_err(anyhow::Error::msg)?;
    let id = linkbus_compress_zstd::dictionary_id(&dictionary).context("the trained dictionary has no id")?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&out)
        .with_context(|| format!("writing {}", out.display()))?;
    std::io::Write::write_all(&mut file, &dictionary)
        .with_context(|| format!("writing {}", out.display()))?;
    println!("{id}");
    eprintln!(
        "wrote a {}-byte dictionary trained on {} samples to {}; the line above is its id",
        dictionary.len(),
        samples.len(),
        out.display()
    );
    Ok(())
}
