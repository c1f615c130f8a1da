package server

import "sandboxd/store"

// Permissions of the contract's role model.
const (
	PermProjectUpdate = "project.update" // provision, resume, teardown, delete, exec, terminals, file writes
	PermProjectRead   = "project.read"   // get/list sessions, read files and logs
	PermAuditRead     = "audit.read"
	PermOrgManage     = "org.manage"
	// PermOperate is not a role's: users who operate the installation
	// (store.Principal.Operator) change plans and grant credits.
	PermOperate = "installation.operate"
)

var rolePerms = map[string][]string{
	store.RoleOwner:     {PermProjectUpdate, PermProjectRead, PermAuditRead, PermOrgManage},
	store.RoleAdmin:     {PermProjectUpdate, PermProjectRead, PermAuditRead, PermOrgManage},
	store.RoleDeveloper: {PermProjectUpdate, PermProjectRead},
	store.RoleViewer:    {PermProjectRead},
}

// Can reports whether role grants perm. Unknown roles grant nothing.
func Can(role, perm string) bool {
	for _, p := range rolePerms[role] {
		if p == perm {
			return true
		}
	}
	return false
}

// Permissions lists what a role grants (for GET /v1/me).
func Permissions(role string) []string {
	return append([]string{}, rolePerms[role]...)
}

// permissionsOf lists what a principal may do: its role's, and operating
// the installation for operators.
func permissionsOf(p store.Principal) []string {
	out := Permissions(p.Role)
	if p.Operator {
		out = append(out, PermOperate)
	}
	return out
}
