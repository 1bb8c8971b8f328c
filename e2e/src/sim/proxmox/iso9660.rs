//! A read-only ISO 9660 reader, enough for a NoCloud seed image: the volume
//! label and the files of the root directory.
//!
//! File names are taken, in order of preference, from a Joliet supplementary
//! volume descriptor (UCS-2 names, as `genisoimage -J` writes them), from
//! Rock Ridge `NM` entries (`-r`), or from the plain ISO 9660 names with the
//! `;1` version and a trailing dot removed and lowercased (what Linux shows
//! for a disc without extensions). The label is the primary volume
//! identifier, or the Joliet one when present; cloud-init compares it with
//! `cidata` ignoring case.

use std::collections::BTreeMap;

/// ISO 9660 sectors are 2048 bytes; volume descriptors start at sector 16.
const SECTOR: usize = 2048;
const FIRST_DESCRIPTOR: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IsoError {
    #[error("image of {0} bytes is too small for ISO 9660")]
    TooSmall(usize),
    #[error("no ISO 9660 primary volume descriptor")]
    NoPrimaryDescriptor,
    #[error("directory record at byte {0} is malformed")]
    BadRecord(usize),
    #[error("extent at block {block} ({length} bytes) lies outside the image")]
    OutOfBounds { block: u32, length: u32 },
    #[error("unsupported logical block size {0}")]
    BlockSize(u16),
}

/// A file of the root directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsoFile {
    pub name: String,
    pub data: Vec<u8>,
}

/// A parsed image: its label and root-directory files by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsoImage {
    pub volume_id: String,
    pub joliet_volume_id: Option<String>,
    pub files: BTreeMap<String, Vec<u8>>,
}

impl IsoImage {
    /// The label blkid would report.
    pub fn label(&self) -> &str {
        self.joliet_volume_id
            .as_deref()
            .filter(|l| !l.is_empty())
            .unwrap_or(&self.volume_id)
    }

    pub fn file(&self, name: &str) -> Option<&[u8]> {
        self.files.get(name).map(Vec::as_slice)
    }

    pub fn file_text(&self, name: &str) -> Option<String> {
        self.file(name)
            .map(|data| String::from_utf8_lossy(data).into_owned())
    }
}

#[derive(Debug, Clone, Copy)]
struct Root {
    block: u32,
    length: u32,
}

struct DirEntry {
    name: String,
    block: u32,
    length: u32,
    is_dir: bool,
}

/// Parses the image; only the root directory's regular files are read.
pub fn parse(image: &[u8]) -> Result<IsoImage, IsoError> {
    if image.len() < (FIRST_DESCRIPTOR + 1) * SECTOR {
        return Err(IsoError::TooSmall(image.len()));
    }
    let mut primary: Option<(String, Root, usize)> = None;
    let mut joliet: Option<(String, Root)> = None;
    let mut sector = FIRST_DESCRIPTOR;
    while (sector + 1) * SECTOR <= image.len() {
        let descriptor = &image[sector * SECTOR..(sector + 1) * SECTOR];
        if &descriptor[1..6] != b"CD001" {
            break;
        }
        match descriptor[0] {
            1 if primary.is_none() => {
                let block_size = u16::from_le_bytes([descriptor[128], descriptor[129]]);
                if block_size as usize != SECTOR {
                    return Err(IsoError::BlockSize(block_size));
                }
                let label = trim_label(&String::from_utf8_lossy(&descriptor[40..72]));
                let root = root_record(descriptor, sector * SECTOR + 156)?;
                primary = Some((label, root, SECTOR));
            }
            2 if is_joliet(&descriptor[88..120]) => {
                let label = trim_label(&decode_ucs2(&descriptor[40..72]));
                let root = root_record(descriptor, sector * SECTOR + 156)?;
                joliet = Some((label, root));
            }
            255 => break,
            _ => {}
        }
        sector += 1;
    }
    let (volume_id, primary_root, _) = primary.ok_or(IsoError::NoPrimaryDescriptor)?;

    let entries = match &joliet {
        Some((_, root)) => read_directory(image, *root, NameEncoding::Ucs2)?,
        None => read_directory(image, primary_root, NameEncoding::Plain)?,
    };
    let mut files = BTreeMap::new();
    for entry in entries.into_iter().filter(|e| !e.is_dir) {
        let data = extent(image, entry.block, entry.length)?.to_vec();
        files.insert(entry.name, data);
    }
    Ok(IsoImage {
        volume_id,
        joliet_volume_id: joliet.map(|(label, _)| label),
        files,
    })
}

fn trim_label(label: &str) -> String {
    label.trim_end_matches([' ', '\0']).to_string()
}

/// Joliet escape sequences: `%/@`, `%/C` or `%/E` (UCS-2 levels 1–3).
fn is_joliet(escapes: &[u8]) -> bool {
    escapes
        .windows(3)
        .any(|w| w[0] == b'%' && w[1] == b'/' && matches!(w[2], b'@' | b'C' | b'E'))
}

fn decode_ucs2(bytes: &[u8]) -> String {
    let units: Vec<u16> = bytes
        .chunks_exact(2)
        .map(|pair| u16::from_be_bytes([pair[0], pair[1]]))
        .collect();
    String::from_utf16_lossy(&units)
}

fn root_record(descriptor: &[u8], offset: usize) -> Result<Root, IsoError> {
    let record = &descriptor[156..190];
    if record[0] < 34 {
        return Err(IsoError::BadRecord(offset));
    }
    Ok(Root {
        block: u32_le(&record[2..6]),
        length: u32_le(&record[10..14]),
    })
}

fn u32_le(bytes: &[u8]) -> u32 {
    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

fn extent(image: &[u8], block: u32, length: u32) -> Result<&[u8], IsoError> {
    let start = block as usize * SECTOR;
    let end = start.checked_add(length as usize);
    match end {
        Some(end) if end <= image.len() => Ok(&image[start..end]),
        _ => Err(IsoError::OutOfBounds { block, length }),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum NameEncoding {
    Plain,
    Ucs2,
}

fn read_directory(
    image: &[u8],
    root: Root,
    encoding: NameEncoding,
) -> Result<Vec<DirEntry>, IsoError> {
    let data = extent(image, root.block, root.length)?;
    let base = root.block as usize * SECTOR;
    let mut entries = Vec::new();
    let mut offset = 0;
    while offset < data.len() {
        let length = data[offset] as usize;
        if length == 0 {
            // Records never cross a sector boundary; zero fills the rest.
            offset = (offset / SECTOR + 1) * SECTOR;
            continue;
        }
        if length < 34 || offset + length > data.len() {
            return Err(IsoError::BadRecord(base + offset));
        }
        let record = &data[offset..offset + length];
        offset += length;

        let name_length = record[32] as usize;
        if 33 + name_length > record.len() {
            return Err(IsoError::BadRecord(base + offset - length));
        }
        let raw_name = &record[33..33 + name_length];
        // "." and ".." are the single bytes 0 and 1.
        if name_length == 1 && raw_name[0] <= 1 {
            continue;
        }
        let flags = record[25];
        // The system use area follows the name and its even-length padding.
        let system_use_start = 33 + name_length + usize::from(name_length.is_multiple_of(2));
        let system_use = record.get(system_use_start..).unwrap_or_default();
        let name = match encoding {
            NameEncoding::Ucs2 => strip_version(&decode_ucs2(raw_name)),
            NameEncoding::Plain => rock_ridge_name(system_use).unwrap_or_else(|| {
                strip_version(&String::from_utf8_lossy(raw_name)).to_lowercase()
            }),
        };
        entries.push(DirEntry {
            name,
            block: u32_le(&record[2..6]),
            length: u32_le(&record[10..14]),
            is_dir: flags & 0x02 != 0,
        });
    }
    Ok(entries)
}

/// `NAME.EXT;1` -> `NAME.EXT`; `NAME.;1` -> `NAME`.
fn strip_version(name: &str) -> String {
    let without_version = name.split_once(';').map_or(name, |(n, _)| n);
    without_version.trim_end_matches('.').to_string()
}

/// The Rock Ridge alternate name from `NM` entries of a system use area.
fn rock_ridge_name(mut area: &[u8]) -> Option<String> {
    let mut name: Option<Vec<u8>> = None;
    while area.len() >= 4 {
        let length = area[2] as usize;
        if length < 4 || length > area.len() {
            break;
        }
        if &area[0..2] == b"NM" && length >= 5 {
            let flags = area[4];
            // Flags 2 and 4 mean "." and "..": not a real name.
            if flags & 0x06 == 0 {
                name.get_or_insert_with(Vec::new)
                    .extend_from_slice(&area[5..length]);
            }
        }
        if &area[0..2] == b"ST" {
            break;
        }
        area = &area[length..];
    }
    name.map(|n| String::from_utf8_lossy(&n).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_images_without_primary_descriptor() {
        assert_eq!(parse(&[0u8; 100]), Err(IsoError::TooSmall(100)));
        assert_eq!(
            parse(&vec![0u8; 40 * SECTOR]),
            Err(IsoError::NoPrimaryDescriptor)
        );
    }

    #[test]
    fn plain_names_lose_version_and_case() {
        assert_eq!(strip_version("USER-DATA.;1"), "USER-DATA");
        assert_eq!(strip_version("META-DATA;1"), "META-DATA");
    }

    #[test]
    fn rock_ridge_names_are_read_from_nm_entries() {
        let mut area = vec![b'P', b'X', 4, 1];
        area.extend_from_slice(&[b'N', b'M', 14, 1, 0]);
        area.extend_from_slice(b"user-data");
        assert_eq!(rock_ridge_name(&area).as_deref(), Some("user-data"));
    }
}
