package server

import (
	"cmp"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"sandboxd/server/errdefs"
	"sandboxd/store"
)

func (s *Server) me(c *gin.Context) {
	p := principal(c)
	connected, at, err := s.db.GitConnected(c.Request.Context(), p.User.ID)
	if err != nil {
		s.writeError(c, err)
		return
	}
	github := gin.H{"connected": connected, "connectedAt": nil}
	if connected {
		github["connectedAt"] = at
	}
	c.JSON(http.StatusOK, gin.H{
		"github":       github,
		"user":         gin.H{"id": p.User.ID, "name": p.User.Name},
		"organization": gin.H{"id": p.Org.ID, "name": p.Org.Name},
		"projectId":    p.ProjectID,
		"role":         p.Role,
		"permissions":  permissionsOf(p),
		"tokenId":      p.TokenID,
	})
}

// maxGitToken bounds a Git credential (GitHub's are under 100 characters;
// fine-grained and enterprise tokens are longer).
const maxGitToken = 1024

// connectGitHub: PUT /v1/me/github {"token": "..."} connects (or replaces)
// the caller's credential. It is write-only: no answer ever shows it.
func (s *Server) connectGitHub(c *gin.Context) {
	var req struct {
		Token string `json:"token"`
	}
	if err := decodeJSON(c, &req); err != nil {
		s.writeError(c, err)
		return
	}
	if req.Token == "" || len(req.Token) > maxGitToken || strings.IndexFunc(req.Token, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0 {
		s.writeError(c, badRequest("token: required, 1-%d printable characters without spaces", maxGitToken))
		return
	}
	if err := s.checkGitToken(c.Request.Context(), req.Token); err != nil {
		s.writeError(c, err)
		return
	}
	at, err := s.db.SetGitToken(c.Request.Context(), principal(c).User.ID, req.Token)
	if err != nil {
		s.writeError(c, err)
		return
	}
	s.sessions.GitCredentialChanged(c.Request.Context(), principal(c).User.ID)
	c.JSON(http.StatusOK, gin.H{"github": gin.H{"connected": true, "connectedAt": at}})
}

// disconnectGitHub: DELETE /v1/me/github.
func (s *Server) disconnectGitHub(c *gin.Context) {
	if err := s.db.DeleteGitToken(c.Request.Context(), principal(c).User.ID); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			err = errdefs.NotFound("no GitHub credential is connected")
		}
		s.writeError(c, err)
		return
	}
	// Running sessions stop using it now, not at their next start.
	s.sessions.GitCredentialChanged(c.Request.Context(), principal(c).User.ID)
	c.Status(http.StatusNoContent)
}

type tokenJSON struct {
	ID         string     `json:"id"`
	Name       string     `json:"name"`
	UserID     string     `json:"userId"`
	CreatedAt  time.Time  `json:"createdAt"`
	LastUsedAt *time.Time `json:"lastUsedAt"`
	RevokedAt  *time.Time `json:"revokedAt"`
	Token      string     `json:"token,omitempty"`
}

func toTokenJSON(t store.Token) tokenJSON {
	return tokenJSON{ID: t.ID, Name: t.Name, UserID: t.UserID, CreatedAt: t.CreatedAt, LastUsedAt: t.LastUsedAt, RevokedAt: t.RevokedAt}
}

// createToken makes a new token for the caller (shown once).
func (s *Server) createToken(c *gin.Context) {
	var req struct {
		Name string `json:"name"`
	}
	if err := decodeJSON(c, &req); err != nil {
		s.writeError(c, err)
		return
	}
	if err := store.ValidName(req.Name); err != nil {
		s.writeError(c, badRequest("name: %v", err))
		return
	}
	p := principal(c)
	t, plain, err := s.db.CreateToken(c.Request.Context(), p.Org.ID, p.User.ID, req.Name)
	if err != nil {
		s.writeError(c, err)
		return
	}
	auditDetail(c, "tokenId", t.ID)
	out := toTokenJSON(t)
	out.Token = plain
	c.JSON(http.StatusCreated, out)
}

// listTokens lists the caller's tokens; with org.manage, ?all=true lists the org's.
func (s *Server) listTokens(c *gin.Context) {
	p := principal(c)
	user := p.User.ID
	if c.Query("all") == "true" && Can(p.Role, PermOrgManage) {
		user = ""
	}
	ts, err := s.db.ListTokens(c.Request.Context(), p.Org.ID, user)
	if err != nil {
		s.writeError(c, err)
		return
	}
	out := make([]tokenJSON, 0, len(ts))
	for _, t := range ts {
		out = append(out, toTokenJSON(t))
	}
	c.JSON(http.StatusOK, gin.H{"tokens": out})
}

// revokeToken revokes one of the caller's tokens (any of the org's with org.manage).
func (s *Server) revokeToken(c *gin.Context) {
	p := principal(c)
	id := c.Param("id")
	auditDetail(c, "tokenId", id)
	t, err := s.db.GetToken(c.Request.Context(), p.Org.ID, id)
	if err != nil || (t.UserID != p.User.ID && !Can(p.Role, PermOrgManage)) {
		s.writeError(c, errdefs.NotFound("no such token"))
		return
	}
	if t.UserID != p.User.ID && p.Role != store.RoleOwner {
		if owner, err := s.isOwner(c, p.Org.ID, t.UserID); err != nil || owner {
			s.writeError(c, cmp.Or[error](err, errdefs.Forbidden("only an owner can revoke an owner's token")))
			return
		}
	}
	if err := s.db.RevokeToken(c.Request.Context(), p.Org.ID, id); err != nil {
		s.writeError(c, err)
		return
	}
	c.Status(http.StatusNoContent)
}

func (s *Server) orgParam(c *gin.Context) (store.Principal, bool) {
	p := principal(c)
	if c.Param("orgId") != p.Org.ID {
		s.writeError(c, errdefs.NotFound("no such organization"))
		return p, false
	}
	return p, true
}

// addMember creates a user in the org with a role and returns their first token.
func (s *Server) addMember(c *gin.Context) {
	p, ok := s.orgParam(c)
	if !ok {
		return
	}
	var req struct {
		Name string `json:"name"`
		Role string `json:"role"`
	}
	if err := decodeJSON(c, &req); err != nil {
		s.writeError(c, err)
		return
	}
	if err := store.ValidName(req.Name); err != nil {
		s.writeError(c, badRequest("name: %v", err))
		return
	}
	if !store.ValidRole(req.Role) {
		s.writeError(c, badRequest("role: must be owner, admin, developer or viewer"))
		return
	}
	if req.Role == store.RoleOwner && p.Role != store.RoleOwner {
		s.writeError(c, errdefs.Forbidden("only an owner can add an owner"))
		return
	}
	u, t, plain, err := s.db.AddMember(c.Request.Context(), p.Org.ID, req.Name, req.Role)
	if err != nil {
		s.writeError(c, err)
		return
	}
	auditDetail(c, "userId", u.ID)
	auditDetail(c, "role", req.Role)
	tj := toTokenJSON(t)
	tj.Token = plain
	c.JSON(http.StatusCreated, gin.H{"user": gin.H{"id": u.ID, "name": u.Name}, "role": req.Role, "token": tj})
}

func (s *Server) listMembers(c *gin.Context) {
	p, ok := s.orgParam(c)
	if !ok {
		return
	}
	ms, err := s.db.ListMembers(c.Request.Context(), p.Org.ID)
	if err != nil {
		s.writeError(c, err)
		return
	}
	out := make([]gin.H, 0, len(ms))
	for _, m := range ms {
		out = append(out, gin.H{"userId": m.UserID, "name": m.UserName, "role": m.Role, "createdAt": m.CreatedAt})
	}
	c.JSON(http.StatusOK, gin.H{"members": out})
}

func (s *Server) updateMember(c *gin.Context) {
	p, ok := s.orgParam(c)
	if !ok {
		return
	}
	var req struct {
		Role string `json:"role"`
	}
	if err := decodeJSON(c, &req); err != nil {
		s.writeError(c, err)
		return
	}
	if !store.ValidRole(req.Role) {
		s.writeError(c, badRequest("role: must be owner, admin, developer or viewer"))
		return
	}
	if p.Role != store.RoleOwner {
		owner, err := s.isOwner(c, p.Org.ID, c.Param("userId"))
		if err != nil || owner || req.Role == store.RoleOwner {
			s.writeError(c, cmp.Or[error](err, errdefs.Forbidden("only an owner can make an owner or change an owner's role")))
			return
		}
	}
	auditDetail(c, "userId", c.Param("userId"))
	auditDetail(c, "role", req.Role)
	if err := s.db.SetMemberRole(c.Request.Context(), p.Org.ID, c.Param("userId"), req.Role); err != nil {
		s.writeError(c, memberErr(err))
		return
	}
	c.JSON(http.StatusOK, gin.H{"userId": c.Param("userId"), "role": req.Role})
}

func (s *Server) removeMember(c *gin.Context) {
	p, ok := s.orgParam(c)
	if !ok {
		return
	}
	auditDetail(c, "userId", c.Param("userId"))
	if p.Role != store.RoleOwner {
		if owner, err := s.isOwner(c, p.Org.ID, c.Param("userId")); err != nil || owner {
			s.writeError(c, cmp.Or[error](err, errdefs.Forbidden("only an owner can remove an owner")))
			return
		}
	}
	if err := s.db.RemoveMember(c.Request.Context(), p.Org.ID, c.Param("userId")); err != nil {
		s.writeError(c, memberErr(err))
		return
	}
	c.Status(http.StatusNoContent)
}

// isOwner reports whether a user is an owner of the org. An unreadable
// member list is an error: the owner checks fail closed.
func (s *Server) isOwner(c *gin.Context, orgID, userID string) (bool, error) {
	ms, err := s.db.ListMembers(c.Request.Context(), orgID)
	if err != nil {
		return false, err
	}
	for _, m := range ms {
		if m.UserID == userID {
			return m.Role == store.RoleOwner, nil
		}
	}
	return false, nil
}

func memberErr(err error) error {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return errdefs.NotFound("no such member")
	case errors.Is(err, store.ErrConflict):
		return errdefs.Conflict("an organization keeps at least one owner")
	case errors.Is(err, store.ErrInvalid):
		return badRequest("role: invalid")
	}
	return err
}

func (s *Server) listAudit(c *gin.Context) {
	p := principal(c)
	f := store.AuditFilter{OrgID: p.Org.ID, SessionID: c.Query("sessionId"), Action: c.Query("action"), UserID: c.Query("userId")}
	for _, b := range []struct {
		name string
		t    *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		if v := c.Query(b.name); v != "" {
			t, err := time.Parse(time.RFC3339, v)
			if err != nil {
				s.writeError(c, badRequest("%s: must be an RFC 3339 time", b.name))
				return
			}
			*b.t = t
		}
	}
	if v := c.Query("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			s.writeError(c, badRequest("limit: must be 1-1000"))
			return
		}
		f.Limit = n
	}
	recs, err := s.db.ListAudit(c.Request.Context(), f)
	if err != nil {
		s.writeError(c, err)
		return
	}
	out := make([]gin.H, 0, len(recs))
	for _, r := range recs {
		out = append(out, gin.H{
			"time": r.Time, "orgId": r.OrgID, "userId": r.UserID, "tokenId": r.TokenID,
			"action": r.Action, "sessionId": r.SessionID, "outcome": r.Outcome, "status": r.Status,
			"remoteAddr": r.RemoteAddr, "requestId": r.RequestID, "details": r.Details,
		})
	}
	c.JSON(http.StatusOK, gin.H{"records": out})
}
