package server

import (
	"reflect"
	"testing"

	"sandboxd/store"
)

func TestCanTable(t *testing.T) {
	perms := []string{PermProjectUpdate, PermProjectRead, PermAuditRead, PermOrgManage}
	want := map[string]map[string]bool{
		store.RoleOwner:     {PermProjectUpdate: true, PermProjectRead: true, PermAuditRead: true, PermOrgManage: true},
		store.RoleAdmin:     {PermProjectUpdate: true, PermProjectRead: true, PermAuditRead: true, PermOrgManage: true},
		store.RoleDeveloper: {PermProjectUpdate: true, PermProjectRead: true},
		store.RoleViewer:    {PermProjectRead: true},
		"":                  {},
		"root":              {},
		"Owner":             {},
	}
	for role, grants := range want {
		for _, perm := range perms {
			if got := Can(role, perm); got != grants[perm] {
				t.Errorf("Can(%q, %q) = %v, want %v", role, perm, got, grants[perm])
			}
		}
		if Can(role, "") || Can(role, "project.delete") {
			t.Errorf("Can(%q, unknown permission) = true", role)
		}
		var list []string
		for _, perm := range perms {
			if grants[perm] {
				list = append(list, perm)
			}
		}
		got := Permissions(role)
		if len(got) != len(list) || (len(list) > 0 && !reflect.DeepEqual(got, list)) {
			t.Errorf("Permissions(%q) = %v, want %v", role, got, list)
		}
	}
	if Can(store.RoleViewer, PermProjectUpdate) {
		t.Error("viewer must not have project.update")
	}
	// Permissions returns a copy: changing it does not change the table.
	p := Permissions(store.RoleViewer)
	p[0] = PermOrgManage
	if Can(store.RoleViewer, PermOrgManage) {
		t.Error("Permissions returned the table itself")
	}
}
