//! The OpenAPI document (`docs/openapi.yaml`, served at `/openapi.yaml`) names every route the
//! router serves, with the same method, and nothing else.

use std::collections::BTreeSet;

use pml_server::api::routes;
use pml_server::api::status::OPENAPI_YAML;

#[test]
fn every_route_is_documented_and_every_documented_path_is_served() {
    let document: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(OPENAPI_YAML).expect("docs/openapi.yaml is YAML");
    let paths = document["paths"].as_mapping().expect("paths");
    let served: BTreeSet<(String, String)> = routes()
        .into_iter()
        .map(|(method, path, _)| (method.to_string(), path.to_string()))
        .collect();
    let documented: BTreeSet<(String, String)> = paths
        .iter()
        .flat_map(|(path, item)| {
            let path = path.as_str().expect("path").to_string();
            item.as_mapping()
                .expect("path item")
                .keys()
                .filter_map(|key| key.as_str())
                .filter(|key| ["get", "post", "put", "delete", "patch"].contains(key))
                .map(move |method| (method.to_string(), path.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(served, documented);
}
