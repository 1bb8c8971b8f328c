//! `/nodes/{node}/storage/{storage}/...`: volumes and uploads.

use reqwest::multipart::{Form, Part};
use serde::Serialize;

use super::error::Result;
use super::types::StorageContent;
use super::upid::Upid;
use super::{NoParams, ProxmoxClient, api_path, api_path_with_volume};

/// One storage as seen from one node. Get it with [`ProxmoxClient::storage`].
#[derive(Debug, Clone)]
pub struct StorageApi<'a> {
    client: &'a ProxmoxClient,
    node: String,
    storage: String,
}

#[derive(Serialize)]
struct ContentQuery<'q> {
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'q str>,
}

impl<'a> StorageApi<'a> {
    pub(crate) fn new(client: &'a ProxmoxClient, node: &str, storage: &str) -> Self {
        Self {
            client,
            node: node.to_owned(),
            storage: storage.to_owned(),
        }
    }

    fn path(&self, tail: &str) -> String {
        api_path(&["nodes", &self.node, "storage", &self.storage, tail])
    }

    /// `GET …/content[?content=iso]`.
    pub async fn content(&self, content: Option<&str>) -> Result<Vec<StorageContent>> {
        self.client
            .get(&self.path("content"), &ContentQuery { content })
            .await
    }

    /// `POST …/upload` with `content=iso`: an `imgcopy` task. PVE wants the
    /// file in a multipart part named `filename` whose file name is the
    /// volume's name (`user-data-105.iso`; it must end in `.iso` or `.img`).
    /// The volume becomes `<storage>:iso/<file_name>`.
    pub async fn upload_iso(&self, file_name: &str, bytes: Vec<u8>) -> Result<Upid> {
        let part = Part::bytes(bytes)
            .file_name(file_name.to_owned())
            .mime_str("application/octet-stream")
            .expect("static MIME type is valid");
        // `content` first: pve-http-server checks the parameters it has read
        // (and the Datastore.AllocateTemplate privilege) as the file streams in.
        let form = Form::new().text("content", "iso").part("filename", part);
        self.client.post_multipart(&self.path("upload"), form).await
    }

    /// The volume id an upload of `file_name` as ISO creates.
    pub fn iso_volume_id(&self, file_name: &str) -> String {
        format!("{}:iso/{}", self.storage, file_name)
    }

    /// `DELETE …/content/{volid}`: an `imgdel` task on recent releases,
    /// `null` (done synchronously) on older ones.
    pub async fn delete_volume(&self, volid: &str) -> Result<Option<Upid>> {
        let path = api_path_with_volume(
            &["nodes", &self.node, "storage", &self.storage, "content"],
            volid,
        );
        self.client.delete(&path, &NoParams).await
    }
}

#[cfg(test)]
mod tests {
    use crate::proxmox::client::test_support::client;

    #[test]
    fn storage_paths_and_iso_volume_ids() {
        let client = client();
        let storage = client.storage("pve1", "local");
        assert_eq!(storage.path("upload"), "/nodes/pve1/storage/local/upload");
        assert_eq!(
            storage.iso_volume_id("user-data-105.iso"),
            "local:iso/user-data-105.iso"
        );
    }
}
