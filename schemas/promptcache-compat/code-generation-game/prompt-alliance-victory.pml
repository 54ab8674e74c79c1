<prompt schema="code-generation-game">
    <map.py/>
    <player.py/>
    <game.py/>
    <user>
        Change is_game_over so that allied players share a victory: if the strategic points captured
        by a player and all of their allies together cover every strategic point on the map, the game
        is over and that whole alliance wins. Return the list of winning players instead of a single
        player, and update the other branches to match.
    </user>
</prompt>
