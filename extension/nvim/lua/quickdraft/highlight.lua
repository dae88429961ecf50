-- The ghost text's highlight group, QuickdraftSuggestion: always distinguishable from code.
--
-- Linking to Comment is right only where Comment has a colour of its own in the mode the
-- screen is drawn in: a cterm foreground with 'notermguicolors' (a 256-colour terminal, tmux), a
-- gui foreground with 'termguicolors'. Neovim's default colorscheme gives Comment a gui colour
-- only, so in a 256-colour terminal a link drew suggestions in the normal text colour and a
-- multi-line suggestion looked like code already in the file. Where Comment has no such colour
-- (or the same one as Normal), the group gets explicit grey italics for both modes.
--
-- apply() runs at setup(), on ColorScheme, at VimEnter and when 'termguicolors' changes. A definition that is
-- not the plugin's (yours, or a colorscheme's) is left alone.

local api = vim.api

local M = {}

M.group = 'QuickdraftSuggestion'

--- What the group gets where Comment cannot be used: grey (244 of the 256-colour palette,
--- #808080) and italic, in both modes.
M.fallback = { ctermfg = 244, fg = '#808080', italic = true, cterm = { italic = true } }

--- The definition last set by apply(), to tell it from one set by someone else.
local applied = nil

local function without_default(hl)
  local copy = vim.deepcopy(hl or {})
  copy.default = nil
  return copy
end

--- The key of a group's foreground in the current mode: `fg` with 'termguicolors', else `ctermfg`.
---@param termguicolors boolean
---@return string
function M.fg_key(termguicolors)
  return termguicolors and 'fg' or 'ctermfg'
end

--- The definition for the ghost text, given Comment's and Normal's effective attributes (as
--- `nvim_get_hl(0, { name = ..., link = false })` returns them) and the mode. Pure.
---@param comment table
---@param normal table
---@param termguicolors boolean
---@return table an nvim_set_hl() definition
function M.spec(comment, normal, termguicolors)
  local key = M.fg_key(termguicolors)
  local fg = comment and comment[key]
  if fg ~= nil and fg ~= (normal and normal[key]) then
    return { link = 'Comment' }
  end
  return vim.deepcopy(M.fallback)
end

--- Set QuickdraftSuggestion for the current colorscheme and mode, unless someone else defined it.
---@return table the group's definition now
function M.apply()
  local current = without_default(api.nvim_get_hl(0, { name = M.group }))
  local ours = vim.tbl_isempty(current) or (applied ~= nil and vim.deep_equal(current, applied))
  if ours then
    local spec = M.spec(
      api.nvim_get_hl(0, { name = 'Comment', link = false }),
      api.nvim_get_hl(0, { name = 'Normal', link = false }),
      vim.o.termguicolors
    )
    -- Not `default = true`: after `:highlight clear` a default link would not be set again.
    api.nvim_set_hl(0, M.group, spec)
    applied = without_default(api.nvim_get_hl(0, { name = M.group }))
  end
  return api.nvim_get_hl(0, { name = M.group })
end

--- apply() now, on every ColorScheme, at VimEnter and whenever 'termguicolors' changes.
---@param augroup integer
function M.setup(augroup)
  -- (not `callback = M.apply`: a callback that returns a true value deletes its autocmd)
  local function apply()
    M.apply()
  end
  apply()
  -- VimEnter: OptionSet does not fire during startup, where an init file may set
  -- 'termguicolors' after setup().
  api.nvim_create_autocmd({ 'ColorScheme', 'VimEnter' }, { group = augroup, callback = apply })
  api.nvim_create_autocmd('OptionSet', { group = augroup, pattern = 'termguicolors', callback = apply })
end

return M
