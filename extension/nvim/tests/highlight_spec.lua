-- The ghost text's highlight (QuickdraftSuggestion) in a real headless Neovim: it must have a
-- foreground colour of its own in the mode the screen is drawn in, whatever the colorscheme.
-- Neovim's default colorscheme gives Comment a gui colour only, so with 'notermguicolors' (a
-- 256-colour terminal, tmux) a plain link to Comment drew suggestions as normal text.
--
-- Driven by tests/e2e/test_nvim.py (QD_PLUGIN, QD_RESULT); the colorschemes are written here.

vim.opt.runtimepath:prepend(os.getenv('QD_PLUGIN'))
local H = dofile(os.getenv('QD_PLUGIN') .. '/tests/harness.lua')

local api = vim.api
local GROUP = 'QuickdraftSuggestion'

-- Two colorschemes of our own: Comment with a gui colour only, and Comment drawn like Normal.
local colors = vim.fn.tempname()
vim.fn.mkdir(colors .. '/colors', 'p')
local function colorscheme(name, lines)
  local file = assert(io.open(colors .. '/colors/' .. name .. '.vim', 'w'))
  file:write(table.concat(vim.list_extend({ 'hi clear', "let g:colors_name = '" .. name .. "'" }, lines), '\n'))
  file:close()
end
colorscheme('qd_gui_only', { 'hi Normal guifg=#d0d0d0 guibg=#202020', 'hi Comment guifg=#7f848e gui=italic' })
colorscheme('qd_comment_like_normal', { 'hi Normal ctermfg=252 guifg=#d0d0d0', 'hi Comment ctermfg=252 guifg=#d0d0d0' })
vim.opt.runtimepath:append(colors)

local function hl(name, link)
  return api.nvim_get_hl(0, { name = name, link = link })
end

local function highlight_line()
  return vim.trim(api.nvim_exec2('highlight ' .. GROUP, { output = true }).output)
end

H.run(function()
  vim.o.termguicolors = false
  vim.cmd.colorscheme('qd_gui_only')
  H.eq('the colorscheme\'s Comment has no cterm colour', nil, hl('Comment', false).ctermfg)

  require('quickdraft').setup({ cmd = { 'true' }, filetypes = { 'quickdraft-test-none' } })
  local own = hl(GROUP, false)
  H.check('notermguicolors, Comment without a cterm colour: the ghost text has a cterm foreground',
    own.ctermfg ~= nil, { hl = own, shown = highlight_line() })
  H.check('... and does not link to Comment', hl(GROUP, true).link == nil, hl(GROUP, true))
  H.check('... and is italic in a terminal too', own.cterm and own.cterm.italic == true, own)
  H.data.gui_only = highlight_line()

  vim.cmd.colorscheme('default')
  H.check('Neovim\'s default colorscheme, notermguicolors: a cterm foreground',
    hl(GROUP, false).ctermfg ~= nil, { hl = hl(GROUP, false), comment = hl('Comment', false) })
  H.data.default = highlight_line()

  vim.cmd.colorscheme('vim') -- Comment: ctermfg=14 guifg=#80a0ff
  H.check('a colorscheme whose Comment has a cterm colour: re-applied on ColorScheme, linked to Comment',
    hl(GROUP, true).link == 'Comment', { hl = hl(GROUP, true), shown = highlight_line() })
  H.data.vim = highlight_line()

  vim.cmd.colorscheme('qd_comment_like_normal')
  H.check('Comment drawn like Normal: explicit colours',
    hl(GROUP, true).link == nil and hl(GROUP, false).ctermfg == 244, hl(GROUP, true))

  vim.cmd.colorscheme('qd_gui_only')
  vim.cmd('set termguicolors')
  H.check('termguicolors, Comment with a gui colour: linked to Comment', hl(GROUP, true).link == 'Comment',
    hl(GROUP, true))
  vim.cmd('set notermguicolors')
  H.check('back to notermguicolors: a cterm foreground again', hl(GROUP, false).ctermfg ~= nil, hl(GROUP, true))

  -- A definition of your own stays until a colorscheme clears it.
  vim.cmd('highlight ' .. GROUP .. ' ctermfg=1 guifg=#ff0000')
  vim.cmd('set termguicolors')
  H.eq('your own definition is left alone', 1, hl(GROUP, false).ctermfg)
  vim.cmd('set notermguicolors')
end)
