use mongodb::bson::doc;

use super::*;

#[test]
fn update_descriptions_apply_to_nested_documents_and_arrays() {
    let mut d = doc! { "a": 1, "data": { "x": 1, "l": [1, 2, 3] } };
    set_path(&mut d, "data.x", Bson::Int32(2));
    set_path(&mut d, "data.y.z", Bson::Int32(3));
    set_path(&mut d, "data.l.1", Bson::Int32(9));
    set_path(&mut d, "b", Bson::Int32(4));
    remove_path(&mut d, "a");
    truncate_path(&mut d, "data.l", 2);
    assert_eq!(
        d,
        doc! { "data": { "x": 2, "l": [1, 9], "y": { "z": 3 } }, "b": 4 }
    );
    remove_path(&mut d, "data.y.z");
    assert_eq!(
        d.get_document("data").unwrap().get_document("y").unwrap(),
        &doc! {}
    );
}
