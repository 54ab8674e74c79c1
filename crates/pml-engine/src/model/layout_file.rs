//! The layout cache's file: a table (magic, then per matrix its name, stored type, layout
//! kind, shape, offset and length, little-endian) followed by each matrix's bytes on a page
//! boundary; how it is read, written (temporary file, synced, renamed) and trimmed.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use candle_core::quantized::GgmlDType;
use pml_home::atomic_write::is_temporary;
use pml_kernels::memory::mapped::MappedFile;
use pml_kernels::quant::{LayoutKind, LayoutShape};

use super::weights::CachedLayout;

const MAGIC: &[u8; 8] = b"PMLLAYT1";
/// Layouts start on page boundaries, so a mapped layout is aligned for any block type.
const ALIGN: u64 = 4096;
/// Age from which a temporary file no writer touches is left over.
const STALE_TEMPORARY: std::time::Duration = std::time::Duration::from_secs(3600);
/// candle's block types, by the name a cache file stores.
const DTYPES: [GgmlDType; 15] = [
    GgmlDType::F32,
    GgmlDType::F16,
    GgmlDType::BF16,
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q8_0,
    GgmlDType::Q8_1,
    GgmlDType::Q2K,
    GgmlDType::Q3K,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
    GgmlDType::Q8K,
];

/// What one cached matrix is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Layout {
    Quant(LayoutShape),
    Rows {
        dtype: GgmlDType,
        rows: usize,
        columns: usize,
    },
}

#[derive(Clone, Debug)]
pub struct Entry {
    pub layout: Layout,
    /// The type the model file stores the matrix in.
    pub stored_dtype: GgmlDType,
    pub offset: u64,
    pub len: u64,
}

/// A cache file mapped, and its table by matrix name.
pub type CacheFile = (Arc<MappedFile>, HashMap<String, Entry>);

/// The file at `path` and its table, or `None` where there is none.
pub fn read_file(path: &Path) -> std::io::Result<Option<CacheFile>> {
    let file = match MappedFile::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let entries = parse_table(file.bytes()).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, "malformed layout table")
    })?;
    Ok(Some((file, entries)))
}

/// Little-endian reads over a byte slice; `None` past its end.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if n > self.bytes.len() {
            return None;
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Some(head)
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn usize(&mut self) -> Option<usize> {
        usize::try_from(self.u64()?).ok()
    }

    fn string(&mut self) -> Option<String> {
        let len = self.usize()?;
        String::from_utf8(self.take(len)?.to_vec()).ok()
    }
}

fn parse_table(bytes: &[u8]) -> Option<HashMap<String, Entry>> {
    let mut reader = Reader { bytes };
    if reader.take(MAGIC.len())? != MAGIC {
        return None;
    }
    let count = reader.usize()?;
    let mut entries = HashMap::new();
    for _ in 0..count {
        let name = reader.string()?;
        let stored_dtype = dtype_named(&reader.string()?)?;
        let kind = reader.string()?;
        let (a, b, c) = (reader.usize()?, reader.usize()?, reader.usize()?);
        let layout = match kind.strip_prefix("rows:") {
            Some(dtype) => Layout::Rows {
                dtype: dtype_named(dtype)?,
                rows: a,
                columns: b,
            },
            None => Layout::Quant(LayoutShape {
                kind: *LayoutKind::ALL
                    .iter()
                    .find(|known| format!("{known:?}") == kind)?,
                out_features: a,
                in_features: b,
                columns: c,
            }),
        };
        let (offset, len) = (reader.u64()?, reader.u64()?);
        let end = offset.checked_add(len)?;
        if !offset.is_multiple_of(ALIGN) || end > bytes.len() as u64 {
            return None;
        }
        entries.insert(
            name,
            Entry {
                layout,
                stored_dtype,
                offset,
                len,
            },
        );
    }
    Some(entries)
}

fn dtype_named(name: &str) -> Option<GgmlDType> {
    DTYPES
        .into_iter()
        .find(|dtype| format!("{dtype:?}") == name)
}

/// A table entry's fields (name, stored type, kind, shape) and the bytes it describes.
type Described<'a> = (&'a String, GgmlDType, String, [usize; 3], &'a [u8]);

/// Writes every layout to `path`, whole or not at all (`pml_home::atomic_write`).
pub fn write_file(
    path: &Path,
    layouts: &[(String, GgmlDType, CachedLayout)],
) -> std::io::Result<()> {
    let described: Vec<Described> = layouts
        .iter()
        .map(|(name, stored_dtype, layout)| match layout {
            CachedLayout::Quant(matrix) => {
                let (shape, bytes) = matrix.layout();
                let dims = [shape.out_features, shape.in_features, shape.columns];
                (
                    name,
                    *stored_dtype,
                    format!("{:?}", shape.kind),
                    dims,
                    bytes,
                )
            }
            CachedLayout::Rows(rows) => {
                let (n_rows, columns) = rows.dims();
                let kind = format!("rows:{:?}", rows.dtype());
                (
                    name,
                    *stored_dtype,
                    kind,
                    [n_rows, columns, 0],
                    rows.bytes(),
                )
            }
        })
        .collect();
    // Entries are fixed-size but for their strings, so a table encoded with placeholder
    // offsets has the real one's length: where the first layout can start.
    let encode = |offsets: &[u64]| {
        let mut table = Vec::new();
        table.extend_from_slice(MAGIC);
        let put = |table: &mut Vec<u8>, value: u64| table.extend_from_slice(&value.to_le_bytes());
        let put_str = |table: &mut Vec<u8>, value: &str| {
            put(table, value.len() as u64);
            table.extend_from_slice(value.as_bytes());
        };
        put(&mut table, described.len() as u64);
        for ((name, dtype, kind, dims, bytes), &offset) in described.iter().zip(offsets) {
            put_str(&mut table, name);
            put_str(&mut table, &format!("{dtype:?}"));
            put_str(&mut table, kind);
            for dim in dims {
                put(&mut table, *dim as u64);
            }
            put(&mut table, offset);
            put(&mut table, bytes.len() as u64);
        }
        table
    };
    let table_len = encode(&vec![0; described.len()]).len() as u64;
    let mut offsets = Vec::with_capacity(described.len());
    let mut offset = table_len.next_multiple_of(ALIGN);
    for (.., bytes) in &described {
        offsets.push(offset);
        offset = (offset + bytes.len() as u64).next_multiple_of(ALIGN);
    }
    let table = encode(&offsets);
    let placed: Vec<(u64, &[u8])> = offsets
        .iter()
        .zip(&described)
        .map(|(&offset, (.., bytes))| (offset, *bytes))
        .collect();

    pml_home::atomic_write::replace_with(path, |file| -> std::io::Result<()> {
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&table)?;
        let mut at = table.len() as u64;
        for (offset, bytes) in placed {
            write_zeros(&mut out, offset - at)?;
            out.write_all(bytes)?;
            at = offset + bytes.len() as u64;
        }
        out.flush()
    })
}

fn write_zeros(out: &mut impl Write, mut n: u64) -> std::io::Result<()> {
    const ZEROS: [u8; ALIGN as usize] = [0; ALIGN as usize];
    while n > 0 {
        let chunk = n.min(ALIGN);
        out.write_all(&ZEROS[..chunk as usize])?;
        n -= chunk;
    }
    Ok(())
}

/// Marks `path` recently used (the directory keeps the most recently used files).
pub fn touch(path: &Path) -> std::io::Result<()> {
    match File::options().write(true).open(path) {
        Ok(file) => file.set_modified(SystemTime::now()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error),
    }
}

/// Removes all but the `keep` most recently modified cache files of `dir`, and temporary files
/// that no writer has touched for [`STALE_TEMPORARY`] (left by a process that exited without
/// waiting for its writer).
pub fn trim_dir(dir: &Path, keep: usize) -> std::io::Result<()> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let modified = entry.metadata()?.modified()?;
        if path
            .extension()
            .is_some_and(|extension| extension == "layout")
        {
            files.push((modified, path));
        } else if is_temporary(&entry.file_name().to_string_lossy())
            && modified.elapsed().is_ok_and(|age| age > STALE_TEMPORARY)
        {
            remove_if_present(&path)?;
        }
    }
    files.sort_by_key(|file| std::cmp::Reverse(file.0));
    for (_, path) in files.into_iter().skip(keep) {
        remove_if_present(&path)?;
    }
    Ok(())
}

/// Removes `path`; another process having removed it first is no error.
fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}
