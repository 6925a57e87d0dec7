//! The committed `include/fmha.h` must be exactly what cbindgen generates from `src/ffi/`.
//! After an intended ABI change (read docs/abi.md first), refresh it with
//! `FMHA_UPDATE_HEADER=1 cargo test --test header_drift`.

#[test]
fn committed_header_matches_generated_header() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/include/fmha.h");
    let generated = include_str!(concat!(env!("OUT_DIR"), "/fmha.h"));
    if std::env::var_os("FMHA_UPDATE_HEADER").is_some() {
        std::fs::write(path, generated).expect("include/fmha.h is writable");
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/fmha.h differs from the header cbindgen generates from src/ffi/; after an intended ABI \
         change run `FMHA_UPDATE_HEADER=1 cargo test --test header_drift`"
    );
}
